"""What each agent sees (``moot.core.sight``), function by function, without running a debate.

test_engine.py and test_faithful.py pin the same rules through whole debates on the scripted
model; these pin each rule on its own, so a change to one (a ring's neighbours, the window of past
rounds, which conversation turns are repeated, what a prompt loses first to fit) fails here by name.
"""

from __future__ import annotations

from moot.core import sight
from moot.core.spec import Budget, NoDecision, Participant, Prompts, ProtocolSpec, Stage, Visibility
from moot.core.types import ContextChunk, DebateTask, Persona, Round, Turn
from moot.models.base import Message, messages_tokens

IDS = ["a", "b", "c", "d", "e"]


def spec(vis: Visibility, **kw: object) -> ProtocolSpec:
    return ProtocolSpec(
        name="sight",
        participants=[Participant(id=i, persona=Persona(name=i.upper())) for i in IDS],
        visibility=vis,
        decision=NoDecision(),
        **kw,  # type: ignore[arg-type]
    )


def turn(speaker: str, rnd: int, text: str = "", *, error: str | None = None) -> Turn:
    return Turn(
        speaker=speaker,
        name=speaker.upper(),
        round=rnd,
        model="m",
        messages=[],
        text=text or f"{speaker}{rnd}",
        error=error,
    )


def rounds(n: int) -> list[Round]:
    """``n`` full rounds and the current one, ``n + 1``, in which a and b have spoken."""
    done = [Round(index=r, turns=[turn(i, r) for i in IDS]) for r in range(1, n + 1)]
    return [*done, Round(index=n + 1, turns=[turn("a", n + 1), turn("b", n + 1)])]


def seen(s: ProtocolSpec, who: str, history: list[Round]) -> list[str]:
    return [f"{t.speaker}{t.round}" for t in sight.visible_turns(s, history, s.participant(who), history[-1])]


def test_a_ring_sees_the_neighbours_either_side_cycling_and_a_star_the_hub() -> None:
    assert sight.neighbours(IDS, "a", "ring", None) == {"e", "b"}
    assert sight.neighbours(IDS, "c", "ring", None) == {"b", "d"}
    assert sight.neighbours(IDS, "e", "ring", None) == {"d", "a"}
    assert sight.neighbours(IDS, "c", "star", "a") == {"a"}
    assert sight.neighbours(IDS, "a", "star", "a") == set(IDS)


def test_visible_turns_apply_who_window_same_round_only_and_topology_in_order() -> None:
    history = rounds(3)
    # The default: everyone's turns of the previous round only, own included, not this round's.
    assert seen(spec(Visibility()), "c", history) == ["a3", "b3", "c3", "d3", "e3"]
    assert seen(spec(Visibility(who="others", window=2)), "c", history) == [
        "a2", "b2", "d2", "e2", "a3", "b3", "d3", "e3",
    ]  # fmt: skip
    assert seen(spec(Visibility(who="self", window=None)), "c", history) == ["c1", "c2", "c3"]
    assert seen(spec(Visibility(who="all", window=0, same_round=True)), "c", history) == ["a4", "b4"]
    assert seen(spec(Visibility(who="none", same_round=True)), "c", history) == []
    assert seen(spec(Visibility(who="others", only=["b", "d"])), "c", history) == ["b3", "d3"]
    # A ring keeps the neighbours (and the speaker's own turns, when it sees them).
    assert seen(spec(Visibility(who="all", topology="ring")), "a", history) == ["a3", "b3", "e3"]
    assert seen(spec(Visibility(who="others", topology="star", hub="a")), "d", history) == ["a3"]
    # Failed turns are never seen.
    history[-2].turns[0] = turn("a", 3, error="boom")
    assert seen(spec(Visibility(who="others")), "c", history) == ["b3", "d3", "e3"]


def test_a_round_not_yet_in_the_transcript_sees_no_past_rounds() -> None:
    history = rounds(2)
    detached = Round(index=9)
    s = spec(Visibility(who="all", window=None))
    assert sight.visible_turns(s, history, s.participant("a"), detached) == []


def test_a_conversation_repeats_only_what_it_did_not_hold_yet() -> None:
    staged = spec(
        Visibility(who="others", same_round=True),
        stages=[Stage(speakers=["a", "b"], order="simultaneous"), Stage(speakers=["c", "d", "e"], order="sequential")],
    )
    own = turn("d", 2)
    assert sight.shown_before(staged, turn("a", 1), own, True)  # an earlier round: held
    assert not sight.shown_before(staged, turn("a", 3), own, True)  # a later round: new
    assert sight.shown_before(staged, turn("a", 2), own, True)  # an earlier stage of its round
    assert sight.shown_before(staged, turn("c", 2), own, True)  # earlier in its sequential stage
    assert not sight.shown_before(staged, turn("e", 2), own, True)  # after it
    assert not sight.shown_before(staged, turn("a", 2), own, False)  # it did not see its round
    # Peers of a simultaneous stage never saw each other.
    assert not sight.shown_before(staged, turn("b", 2), turn("a", 2), True)


def test_the_prompt_limit_is_the_tighter_of_the_spec_s_and_the_window_less_the_reply() -> None:
    s = spec(Visibility(), budget=Budget(max_tokens_per_turn=100, max_prompt_tokens=500))
    p = s.participant("a")
    assert sight.prompt_limit(s, p, None) == 500
    assert sight.prompt_limit(s, p, 1000) == 500
    assert sight.prompt_limit(s, p, 550) == 450  # the reply's 100 tokens come out of the window
    unbounded = spec(Visibility(), budget=Budget(max_tokens_per_turn=100))
    assert sight.prompt_limit(unbounded, p, None) is None
    assert sight.prompt_limit(unbounded, p, 300) == 200


def test_a_conversation_over_budget_loses_whole_earlier_exchanges_oldest_first() -> None:
    s = spec(Visibility(history="conversation"))
    words = " ".join(["w"] * 20)
    head = [Message(role="system", content="sys"), Message(role="user", content="question")]
    exchanges = [
        Message(role="assistant", content=f"reply1 {words}"),
        Message(role="user", content=f"others1 {words}"),
        Message(role="assistant", content=f"reply2 {words}"),
        Message(role="user", content=f"others2 {words}"),
    ]
    tail = [Message(role="assistant", content=f"reply3 {words}"), Message(role="user", content=f"now {words}")]
    messages = head + exchanges + tail
    p = s.participant("a")
    assert sight.fit_prompt(s, p, messages, [], {}, None, conversation=True) == (messages, 0)
    assert sight.fit_prompt(s, p, messages, [], {}, messages_tokens(messages), conversation=True) == (messages, 0)
    # One token over: the oldest exchange (a reply and the message after it) goes, whole.
    fitted, dropped = sight.fit_prompt(s, p, messages, [], {}, messages_tokens(messages) - 1, conversation=True)
    assert (fitted, dropped) == (head + exchanges[2:] + tail, 2)
    # Nothing fits: the system message, the question, the latest reply and the new message stay.
    fitted, dropped = sight.fit_prompt(s, p, messages, [], {}, 1, conversation=True)
    assert (fitted, dropped) == (head + tail, 4)
    assert [m.role for m in fitted] == ["system", "user", "assistant", "user"]


def test_a_prompt_history_over_budget_loses_its_oldest_turns_and_is_rendered_again() -> None:
    s = spec(Visibility(), prompts=Prompts(opening="Q: {question}", rebuttal="Q: {question}\n{history}"))
    p = s.participant("a")
    history = [turn("b", 1, "first " * 10), turn("c", 1, "second " * 10), turn("d", 1, "third")]
    values = {"question": "why?"}
    full = [
        Message(role="system", content="sys"),
        Message(role="user", content="Q: why?\n" + sight.render_history(s, history, "a")),
    ]
    fitted, dropped = sight.fit_prompt(s, p, full, history, values, messages_tokens(full) - 1, conversation=False)
    assert dropped == 1
    assert fitted == [full[0], Message(role="user", content="Q: why?\n" + sight.render_history(s, history[1:], "a"))]
    # Everything gone: the history placeholder says so; a prompt with nothing seen is left alone.
    fitted, dropped = sight.fit_prompt(s, p, full, history, values, 1, conversation=False)
    assert dropped == 3 and fitted[1].content == "Q: why?\n(nothing yet)"
    assert sight.fit_prompt(s, p, full, [], values, 1, conversation=False) == (full, 0)


def test_history_styles_label_the_turns_as_each_paper_does() -> None:
    turns = [turn("a", 1, "mine"), turn("b", 1, "yours")]
    assert sight.render_history(spec(Visibility()), turns, "a") == (
        'Your own answer (round 1):\n"""\nmine\n"""\n\nThe answer of B (round 1):\n"""\nyours\n"""'
    )
    solutions = spec(Visibility(), history_style="solutions")
    # Its own solution first, whatever the order the turns came in.
    assert sight.render_history(solutions, turns[::-1], "a") == (
        "Your previous solution: ```mine```\n\nOne agent solution: ```yours```"
    )
    assert sight.render_history(spec(Visibility(), history_style="named"), turns, "a") == "A: mine\n\nB: yours"
    assert sight.render_history(spec(Visibility(), history_style="lines"), turns, "a") == "mine\nyours"


def test_task_values_number_the_first_passages_and_ask_for_citations_only_with_some() -> None:
    chunks = [ContextChunk(text=f"p{i}", source="s" if i == 1 else None) for i in range(5)]
    task = DebateTask(question="Q?", context=chunks)
    values = sight.task_values(spec(Visibility(), max_context_chunks=2), task)
    assert values["context"] == "[1] p0\n[2] p1 (source: s)"
    assert values["context_block"] == "\n\nContext:\n[1] p0\n[2] p1 (source: s)\n\n"
    assert values["cite"].startswith(" ") and values["cite"].strip()
    bare = sight.task_values(spec(Visibility()), DebateTask(question="Q?"))
    assert (bare["context"], bare["context_block"], bare["cite"], bare["context_json"]) == (
        "(no context given)", "", "", "[]",
    )  # fmt: skip
