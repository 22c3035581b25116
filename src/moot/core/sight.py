"""Sight: what a participant sees when it speaks, and the messages that carry it.

Named for the one question every function here answers, "what does this agent see?", from the
transcript to the messages of its turn:

- which turns it sees (:func:`visible_turns`): its :class:`~moot.core.spec.Visibility` applied to
  the rounds so far (who, the window of past rounds, the current round's earlier speakers, some
  speakers only, the ring or star :func:`neighbours`);
- whether it speaks at all (:func:`kept_turn`: ``reconsider: minority`` keeps a majority holder's
  turn without a call);
- how what it sees is written (:func:`render_history`, :func:`render_transcript` for the decision,
  :func:`task_values` for the question and its context);
- the messages of its turn (:func:`turn_messages`): one prompt, or its continuing conversation
  (:func:`own_last_turn`, :func:`shown_before`), cut to its prompt budget (:func:`prompt_limit`,
  :func:`fit_prompt`).

Not ``visibility``: :class:`~moot.core.spec.Visibility` is the rule as data, this module applies
it and renders the result. Every function is pure: it takes what it reads (the spec, the rounds,
the participant, the model's context window) and changes nothing, so the engine, which makes the
calls and keeps the state, asks here and sends what it is given.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from moot.core.answers import answer_of
from moot.core.spec import CITE, Participant, ProtocolSpec, render
from moot.core.types import DebateResult, DebateTask, Round, Turn
from moot.models.base import BaseChatModel, Message, messages_tokens


def task_values(spec: ProtocolSpec, task: DebateTask) -> dict[str, Any]:
    """The task's placeholders of every template: the question, its context passages (the first
    ``max_context_chunks``) as text and as JSON, ``{cite}`` when there are some, the rounds."""
    chunks = task.context[: spec.max_context_chunks] if spec.max_context_chunks else task.context
    context = "\n".join(
        f"[{i}] {c.text}" + (f" (source: {c.source})" if c.source else "") for i, c in enumerate(chunks, 1)
    )
    context_json = json.dumps([c.model_dump(exclude_none=True) for c in chunks], ensure_ascii=False)
    return {
        "question": task.question,
        "context": context or "(no context given)",
        "context_block": f"\n\nContext:\n{context}\n\n" if context else "",
        "context_json": context_json,
        "cite": f" {CITE}" if chunks else "",
        # "Answer the question{using_context}.": no context is named where there is none.
        "using_context": " using the context" if chunks else "",
        "rounds": spec.rounds,
    }


def neighbours(ids: Sequence[str], pid: str, topology: str, hub: str | None) -> set[str]:
    """Whom ``pid`` sees in a ``ring`` (the participants before and after it in ``ids``, cycling)
    or a ``star`` (the hub sees everyone, the others only the hub)."""
    if topology == "star":
        return set(ids) if pid == hub else {hub or ""}
    i = ids.index(pid)
    return {ids[(i - 1) % len(ids)], ids[(i + 1) % len(ids)]}


def visible_turns(spec: ProtocolSpec, rounds: Sequence[Round], p: Participant, current: Round) -> list[Turn]:
    """The turns participant ``p`` sees when it speaks in round ``current`` (the last of ``rounds``,
    the debate's rounds so far): its answered turns only, in the order they were given."""
    vis = spec.visibility_for(p)
    pid = p.id
    if vis.who == "none":
        return []
    past = rounds[:-1] if rounds and rounds[-1] is current else []
    if vis.window is not None:
        past = past[len(past) - vis.window :] if vis.window else []
    seen = [t for r in past for t in r.turns if t.ok]
    if vis.same_round:
        seen += [t for t in current.turns if t.ok]
    if vis.who == "others":
        seen = [t for t in seen if t.speaker != pid]
    elif vis.who == "self":
        seen = [t for t in seen if t.speaker == pid]
    if vis.only is not None:
        seen = [t for t in seen if t.speaker in vis.only]
    if vis.topology != "full":
        allowed = neighbours([q.id for q in spec.participants], pid, vis.topology, vis.hub)
        seen = [t for t in seen if t.speaker in allowed or t.speaker == pid]
    return seen


def render_history(spec: ProtocolSpec, turns: Sequence[Turn], pid: str) -> str:
    """Earlier turns as quoted blocks, labelled in words (small models copy bracketed
    headers such as ``[Round 2] Name:`` into their own replies); with the ``lines`` history
    style, each turn's text as it is."""
    if spec.history_style == "lines":
        return "\n".join(t.text or "" for t in turns)
    if spec.history_style == "solutions":
        # Du et al.'s quoting; a turn of the agent's own (visibility ``who: all``: the
        # ``history=together`` rendering) comes first, marked as its own.
        own = [f"Your previous solution: ```{t.text}```" for t in turns if t.speaker == pid]
        return "\n\n".join(own + [f"One agent solution: ```{t.text}```" for t in turns if t.speaker != pid])
    if spec.history_style == "named":
        return "\n\n".join(f"{t.name}: {t.text}" for t in turns)
    blocks = []
    for t in turns:
        who = (
            "Your own answer" if t.speaker == pid else f"The answer of {t.name}" + (f", the {t.role}" if t.role else "")
        )
        blocks.append(f'{who} (round {t.round}):\n"""\n{t.text}\n"""')
    return "\n\n".join(blocks)


def render_transcript(spec: ProtocolSpec, result: DebateResult) -> str:
    """Every answered turn of the debate, as the decision's ``{transcript}`` shows it."""
    if spec.history_style == "lines":
        return "\n".join(t.text or "" for r in result.rounds for t in r.turns if t.ok)
    return "\n\n".join(
        f'{t.name} (round {t.round}):\n"""\n{t.text}\n"""' for r in result.rounds for t in r.turns if t.ok
    )


def kept_turn(spec: ProtocolSpec, rounds: Sequence[Round], p: Participant, rnd: Round) -> Turn | None:
    """With ``reconsider: minority``, the previous turn of a participant that holds the previous
    round's majority answer (it keeps it without a call); otherwise None."""
    if spec.reconsider != "minority" or rnd.index < 2 or len(rounds) < 2:
        return None
    previous = rounds[-2]
    answers = {t.speaker: answer_of(t) for t in previous.turns if t.ok}
    counts = Counter(a for a in answers.values() if a is not None).most_common(2)
    if not counts or counts[0][1] < 2 or (len(counts) > 1 and counts[0][1] == counts[1][1]):
        return None
    if answers.get(p.id) != counts[0][0]:
        return None
    return next(t for t in previous.turns if t.speaker == p.id)


def own_last_turn(rounds: Sequence[Round], p: Participant, rnd: Round) -> Turn | None:
    """The participant's latest answered turn of an earlier round (its chat history ends there)."""
    for past in reversed(rounds):
        if past is rnd:
            continue
        for t in past.turns:
            if t.speaker == p.id and t.ok:
                return t
    return None


def shown_before(spec: ProtocolSpec, t: Turn, own: Turn, same_round: bool) -> bool:
    """Whether turn ``t`` was already in the conversation that ended with the agent's turn
    ``own``: every earlier round's visible turns were, and of ``own``'s round those spoken before
    it (an earlier stage, or earlier in a sequential one) when the agent sees the current round."""
    if t.round != own.round:
        return t.round < own.round
    if not same_round:
        return False
    stages = spec.round_stages(own.round)
    where = {sid: (i, j) for i, st in enumerate(stages) for j, sid in enumerate(st.speakers)}
    (ts, tj), (os_, oj) = where.get(t.speaker, (0, 0)), where.get(own.speaker, (0, 0))
    return ts < os_ or (ts == os_ and stages[ts].order == "sequential" and tj < oj)


def prompt_limit(spec: ProtocolSpec, p: Participant, context_tokens: int | None) -> int | None:
    """The most prompt tokens a turn of ``p`` may send: the spec's, or what the model's context
    window (``context_tokens``, None: unknown) leaves after the reply's budget."""
    limits = [spec.budget.max_prompt_tokens]
    if context_tokens is not None:
        limits.append(context_tokens - spec.max_tokens_for(p))
    given = [x for x in limits if x is not None]
    return min(given) if given else None


def fit_prompt(
    spec: ProtocolSpec,
    p: Participant,
    messages: list[Message],
    seen: list[Turn],
    values: dict[str, Any],
    limit: int | None,
    *,
    conversation: bool,
    count: Callable[[str], int | None] | None = None,
) -> tuple[list[Message], int]:
    """Trim a history that would not fit the prompt budget ``limit`` (:func:`prompt_limit`),
    oldest first, and say how much.

    A ``conversation`` (system, question, then the agent's reply and the next user message,
    round after round) loses whole earlier exchanges, oldest first: an earlier reply of the agent
    with the user message that answered it. It keeps the system message, the question, the
    agent's latest reply (its own previous turn, which the papers' agents always see) and the new
    message, so the roles still alternate. A ``prompt`` history loses its oldest turns. Returns
    the messages and how many messages or turns were left out (0: none); what is still over the
    budget once nothing more can go is sent as it is (the engine says so). ``count``: the model's own
    tokenizer (:meth:`~moot.models.base.BaseChatModel.count_tokens`), else moot's estimate counts."""
    if limit is None or messages_tokens(messages, count) <= limit:
        return messages, 0
    if conversation:
        head, middle, tail = messages[:2], messages[2:-2], messages[-2:]
        dropped = 0
        while middle and messages_tokens(head + middle + tail, count) > limit:
            middle = middle[2:]  # (an earlier reply of the agent, the user message after it)
            dropped += 2
        return head + middle + tail, dropped
    if not seen:
        return messages, 0
    prompts = spec.prompts_for(p)
    kept = list(seen)
    dropped = 0
    while kept and messages_tokens(messages, count) > limit:
        kept = kept[1:]
        dropped += 1
        values = values | {"history": render_history(spec, kept, p.id) or "(nothing yet)"}
        messages = [messages[0], messages[1].model_copy(update={"content": render(prompts.rebuttal, values)})]
    return messages, dropped


def _values(spec: ProtocolSpec, task: DebateTask, p: Participant, round_index: int, history: str) -> dict[str, Any]:
    """What ``p``'s prompt templates fill in, with ``history`` rendered."""
    persona = p.persona
    return task_values(spec, task) | {
        "history": history,
        "round": round_index,
        "name": persona.name,
        "role": persona.role,
        "goal": persona.goal,
        "stance": persona.stance or "",
        "style": persona.style or "",
        "persona_json": persona.model_dump_json(exclude_none=True),
        "max_tokens": spec.max_tokens_for(p),
    }


def bare_prompts(spec: ProtocolSpec, task: DebateTask, p: Participant, templates: list[str]) -> list[list[Message]]:
    """The prompt of each of ``p``'s ``templates`` with no history yet (those
    :func:`moot.core.budget.input_problem` reads: the opening, the rebuttal, ...): what no cut of a
    debate's history can shorten, which a model that counts tokens itself is asked to hold."""
    values = _values(spec, task, p, 1, "(nothing yet)")
    system = Message(role="system", content=p.persona.system_prompt())
    return [[system, Message(role="user", content=render(t, values), images=tuple(task.images))] for t in templates]


def turn_messages(
    spec: ProtocolSpec,
    task: DebateTask,
    rounds: Sequence[Round],
    p: Participant,
    rnd: Round,
    seen: list[Turn],
    model: BaseChatModel,
) -> tuple[list[Message], int, str | None]:
    """The messages of ``p``'s turn in round ``rnd`` (the last of ``rounds``), given the turns it
    sees (:func:`visible_turns`), fitted to ``model``'s prompt budget (:func:`prompt_limit`), counted
    by its own tokenizer where it has one (:meth:`~moot.models.base.BaseChatModel.count_tokens`; the
    engine awaits :meth:`~moot.models.base.BaseChatModel.ready_to_count` first); how many earlier
    history entries were left out, in this turn or (a conversation going on from its last request)
    before it; and the warning to record when what is left is still over the budget (None: within it)."""
    limit = prompt_limit(spec, p, model.context_tokens)
    count = model.count_tokens if limit is not None else None
    persona = p.persona
    prompts = spec.prompts_for(p)
    values = _values(spec, task, p, rnd.index, render_history(spec, seen, p.id) or "(nothing yet)")
    vis = spec.visibility_for(p)
    own = own_last_turn(rounds, p, rnd) if vis.history == "conversation" else None
    if own is not None:
        # The papers' chat history: the agent's previous request and its own reply, then what it
        # sees of the others that its conversation does not hold yet (never its own turns: those
        # are the assistant messages).
        seen = [t for t in seen if t.speaker != p.id and not shown_before(spec, t, own, vis.same_round)]
        values["history"] = render_history(spec, seen, p.id) or "(nothing yet)"
        earlier = [*own.messages, Message(role="assistant", content=own.raw or own.text or "")]
        messages = [*earlier, Message(role="user", content=render(prompts.rebuttal, values))]
    else:
        if vis.history == "conversation":
            # The first turn of a conversation: the question, then (a later speaker of a
            # sequential round) what was said before it, as the follow-up message says it.
            if not seen:
                text = render(prompts.opening, values)
            elif prompts.joining is not None:
                text = render(prompts.joining, values)
            else:
                text = render(prompts.opening, values) + "\n\n" + render(prompts.rebuttal, values)
        else:
            text = render(prompts.rebuttal if seen else prompts.opening, values)
        # The task's images are shown with the question: in a conversation, its first message, which
        # its later requests hold too; in a prompt history, every prompt.
        question = Message(role="user", content=text, images=tuple(task.images))
        messages = [Message(role="system", content=persona.system_prompt()), question]
    messages, dropped = fit_prompt(spec, p, messages, seen, values, limit, conversation=own is not None, count=count)
    if own is not None:  # a conversation goes on from its last request: what that left out stays out
        dropped += own.history_trimmed
    if limit is None or (size := messages_tokens(messages, count)) <= limit:
        return messages, dropped, None
    over = (
        f"{p.id}'s prompt in round {rnd.index} is about {size} tokens, over its budget of {limit} "
        "(budget.max_prompt_tokens or the model's context window) with nothing more to leave out: "
        "it was sent as it is"
    )
    return messages, dropped, over
