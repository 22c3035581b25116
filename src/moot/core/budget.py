"""A debate's budget: one rule, used by every front door; and the inputs no budget can hold.

``moot debate``, ``moot run``, ``moot batch`` (and :func:`moot.run_batch`) and ``moot serve`` (its
JSON API, chat endpoint and viewer) all settle a debate's budget here, the same way:

1. a value the caller gives wins: an option (``--timeout``, ``--max-calls``, ``--max-tokens``,
   ``--rounds``), a batch line's own ``timeout``, a request's ``budget.timeout_s``;
2. else the protocol's own ``budget:`` (a protocol file's ``timeout_s: 300``); the shipped presets
   set no timeout;
3. else, for the timeout, :func:`default_timeout_s`: :data:`TIMEOUT_PER_CALL_S` for each model call
   the protocol plans (``moot protocols`` lists them), 600 s for the default debate.

The default fits the documented hardware with room to spare: a 500-token turn of the shipped 1.5B
model decodes at about 5-10 tokens a second on two CPU cores with other work beside it, so a call
takes up to about 100 s, and the calls of a debate share those cores whether they run at once or in
turn. A server lowers every timeout to its own limit (``moot serve --timeout``).

:class:`~moot.core.engine.Engine` runs a spec as it is (``timeout_s=None``: no timeout of its own);
:func:`budget_for` gives a spec the front doors' budget.

:func:`input_problem` refuses, before any call, a question and context that no turn could send: a
context file of 50 MB was sent as 55 million prompt tokens. Each turn's prompt must fit its model's
context window (after the turn's reply), ``budget.max_prompt_tokens`` and ``budget.max_total_tokens``
when set, and in any case :data:`MAX_INPUT_TOKENS`.
"""

from __future__ import annotations

from collections.abc import Mapping

from moot.core import sight
from moot.core.spec import JudgeDecision, ProtocolSpec, SynthesizeDecision
from moot.core.types import ContextChunk, DebateTask
from moot.models.base import BaseChatModel, Message, counted_tokens, least_tokens
from moot.models.images import IMAGE_TOKENS, image_given_problem, text_only

#: The default timeout's allowance for each planned model call, seconds.
TIMEOUT_PER_CALL_S = 120.0


def default_timeout_s(spec: ProtocolSpec) -> float:
    """The timeout of a debate whose caller and protocol set none: :data:`TIMEOUT_PER_CALL_S` per
    planned call (within the call cap)."""
    calls = spec.planned_calls()
    if spec.budget.max_calls is not None:
        calls = min(calls, spec.budget.max_calls)
    return TIMEOUT_PER_CALL_S * max(1, calls)


def apply_budget(
    spec: ProtocolSpec,
    *,
    rounds: int | None = None,
    timeout_s: float | None = None,
    max_calls: int | None = None,
    max_tokens: int | None = None,
) -> ProtocolSpec:
    """``spec`` with the values the caller gave (None: not given) over the protocol's own budget;
    ``max_tokens`` bounds every turn (each participant's own and an LLM decision's too)."""
    budget = spec.budget.model_copy(
        update={
            **({"timeout_s": timeout_s} if timeout_s is not None else {}),
            **({"max_calls": max_calls} if max_calls is not None else {}),
        }
    )
    spec = spec.model_copy(update={"budget": budget, **({"rounds": rounds} if rounds is not None else {})})
    return spec.with_turn_tokens(max_tokens) if max_tokens is not None else spec


def with_default_timeout(spec: ProtocolSpec) -> ProtocolSpec:
    """``spec`` as it is if it has a timeout, else with :func:`default_timeout_s`."""
    if spec.budget.timeout_s is not None:
        return spec
    budget = spec.budget.model_copy(update={"timeout_s": default_timeout_s(spec)})
    return spec.model_copy(update={"budget": budget})


def budget_for(
    spec: ProtocolSpec,
    *,
    rounds: int | None = None,
    timeout_s: float | None = None,
    max_calls: int | None = None,
    max_tokens: int | None = None,
) -> ProtocolSpec:
    """The front doors' rule in one call: the caller's values, else the protocol's, else the default
    timeout."""
    return with_default_timeout(
        apply_budget(spec, rounds=rounds, timeout_s=timeout_s, max_calls=max_calls, max_tokens=max_tokens)
    )


#: The most prompt tokens moot sends in one call when neither the model's context window nor the
#: protocol's ``budget.max_prompt_tokens`` says less: more than any model's window moot knows of.
MAX_INPUT_TOKENS = 1_000_000


def _read_by(template: str, question: str, used: list[ContextChunk]) -> list[tuple[str, str, int]]:
    """The task's texts a template holds, each with how many times (``{context}``, ``{context_block}``
    and ``{context_json}`` each hold the passages)."""
    texts = [("the question", question, template.count("{question"))]
    texts += [("the context", c.text, template.count("{context")) for c in used]
    return texts


def tokens_over(spec: ProtocolSpec, spent: int) -> str | None:
    """What a debate that spent ``spent`` tokens, over ``budget.max_total_tokens``, says in its
    warnings (None within it): the budget is checked before each round, as a stop condition is, and a
    round's calls run to their turn limit."""
    allowed = spec.budget.max_total_tokens
    if allowed is None or spent <= allowed:
        return None
    return (
        f"the debate spent {spent:,} tokens, over budget.max_total_tokens of {allowed:,}: the budget is checked "
        "before each round, and the calls of a round (and the decision) run to their turn limit; lower "
        "budget.max_tokens_per_turn, or the rounds, to keep it closer"
    )


def image_problem(
    spec: ProtocolSpec,
    task: DebateTask,
    models: Mapping[str, BaseChatModel],
    decision_model: BaseChatModel | None = None,
) -> str | None:
    """Why the task's images cannot be shown (None if they can): one is no image, or a stored
    address redacted (:func:`~moot.models.base.image_given_problem`), or a model of a participant,
    or of a decision that calls one, reads text only (:attr:`~moot.models.base.BaseChatModel.reads_images`)."""
    if not task.images:
        return None
    for n, image in enumerate(task.images, 1):
        if (given := image_given_problem(image.url)) is not None:
            return f"image {n}: {given}"
    shown = [models[p.id] for p in spec.participants if p.id in models]
    if decision_model is not None and spec.decision_calls:
        shown.append(decision_model)
    blind = next((m for m in shown if not m.reads_images), None)
    return None if blind is None else text_only(blind.name, len(task.images))


def input_problem(
    spec: ProtocolSpec,
    task: DebateTask,
    models: Mapping[str, BaseChatModel],
    decision_model: BaseChatModel | None = None,
) -> str | None:
    """Why the question and the context the protocol reads cannot be sent (None if they can): the
    first turn whose prompt would hold more tokens than its limit allows, whatever its history.
    ``models`` are the participants' (by id), ``decision_model`` a synthesis' or judge's. Counted with
    moot's own conservative estimate (:func:`~moot.models.base.least_tokens`: words and marks, and
    a token per 4 characters, 2 of CJK, so a text without spaces counts too), so what is refused
    does not fit; or, where the model's window is known and it can count
    (:meth:`~moot.models.base.BaseChatModel.count_tokens`: an embedded model, loaded), by its own
    tokenizer, so what passes fits too (a conversation is cut to it: ``moot serve``'s fit)."""
    if (problem := image_problem(spec, task, models, decision_model)) is not None:
        return problem
    used = task.context[: spec.max_context_chunks] if spec.max_context_chunks else task.context
    budget = spec.budget
    # Each turn's fixed texts, whatever its history: every template it may send (the opening; the
    # rebuttal, with no history yet; the joining; a conversation's first message, both together),
    # and the texts each repeats as often as its placeholders say, beside the agent's system prompt.
    turns: list[tuple[str, list[tuple[str, str, int]], BaseChatModel | None, int, list[Message] | None]] = []
    for p in spec.participants:
        prompts = spec.prompts_for(p)
        templates = [prompts.opening, prompts.rebuttal, *([prompts.joining] if prompts.joining else [])]
        if spec.visibility_for(p).history == "conversation":
            templates.append(prompts.opening + prompts.rebuttal)
        persona = p.persona
        model = models.get(p.id)
        counts = model is not None and model.context_tokens is not None and model.count_tokens("") is not None
        bare: list[list[Message] | None] = (
            [*sight.bare_prompts(spec, task, p, templates)] if counts else [None] * len(templates)
        )
        for template, prompt in zip(templates, bare, strict=True):
            texts = _read_by(template, task.question, used)
            persona_uses = template.count("{persona_json}")
            for field in ("name", "role", "goal", "stance", "style"):
                value = getattr(persona, field) or ""
                texts.append(("the agent's persona", value, template.count("{" + field + "}") + persona_uses))
            texts.append(("the agent's persona", persona.system_prompt(), 1))
            turns.append((p.id, texts, model, spec.max_tokens_for(p), prompt))
    decision = spec.decision
    if isinstance(decision, SynthesizeDecision | JudgeDecision) and spec.decision_calls:
        turns.append(("the decision", _read_by(decision.prompt, task.question, used), decision_model,
                      decision.max_tokens, None))  # fmt: skip
    counted: dict[str, int] = {}
    for who, texts, model, reply, prompt in turns:
        # (the limit, why it is the limit, what would raise it)
        limits: list[tuple[int, str, str]] = []
        bigger_model = "shorten the context or the question, or use a model with a larger context window"
        window = model.context_tokens if model is not None else None
        if window is not None:  # the reply's room too, unless the reply alone may fill the window
            name = model.name if model is not None else "its model"
            limits.append(
                (window - reply, f"{name}'s context window of {window:,} tokens less the {reply:,}-token reply",
                 f"{bigger_model}, or lower the reply's budget.max_tokens_per_turn")
                if reply < window
                else (window, f"{name}'s context window of {window:,} tokens", bigger_model)
            )  # fmt: skip
        if budget.max_prompt_tokens is not None:
            limits.append((budget.max_prompt_tokens, f"budget.max_prompt_tokens of {budget.max_prompt_tokens:,}",
                           "raise budget.max_prompt_tokens to at least {needed:,}, or shorten the context or the "
                           "question"))  # fmt: skip
        if window is None and budget.max_prompt_tokens is None:
            limits.append((MAX_INPUT_TOKENS, f"moot's limit of {MAX_INPUT_TOKENS:,} tokens for one prompt",
                           "shorten the context or the question"))  # fmt: skip
        sharing = 1
        if budget.max_total_tokens is not None:
            # A round's prompts are sent together, before the budget is looked at again (between
            # rounds): they share it, or one round of long prompts could spend it several times over.
            # (a turn's self-check, when the protocol asks for one, sends its prompt again)
            per_turn = 2 if spec.probe is not None and spec.probe.self_check else 1
            sharing = 1 if who == "the decision" else spec.speakers_per_round() * per_turn
            total = budget.max_total_tokens
            raise_total = (
                "raise budget.max_total_tokens to at least {total_needed:,}, or shorten the context or the question"
            )
            limits.append(
                (total // max(1, sharing), f"budget.max_total_tokens of {total:,}", raise_total)
                if sharing <= 1
                else (total // sharing, f"budget.max_total_tokens of {total:,}, shared by a round's {sharing} prompts",
                      raise_total)
            )  # fmt: skip
        limit, why, fix = min(limits)
        cap = max(limit, 0)
        # The task's images, shown with the question in every prompt, at the least a model charges.
        needed, named = IMAGE_TOKENS * len(task.images), ["the images"] if task.images else []
        for what, text, uses in texts:
            if not uses or not text:
                continue
            key = f"{cap}:{id(text)}"
            if key not in counted:
                counted[key] = least_tokens(text, cap)
            needed += counted[key] * uses
            if what not in named:
                named.append(what)
            if needed > cap:
                break
        exact = None
        if needed <= limit and model is not None and prompt is not None:
            # Within the estimate, a lower bound (so no more than about a window's text is counted):
            # a model that counts tokens itself (an embedded one, loaded) counts the prompt as it is
            # sent with no history yet, so that what passes fits too (moot's estimate counts words,
            # under a tokenizer's count for most text: a conversation fitted by it did not fit). A
            # count that fails leaves the estimate.
            exact = counted_tokens(prompt, model.count_tokens)
            needed = exact if exact is not None else needed
        if needed > limit:
            what = " and ".join(named) if len(named) < 3 else f"{', '.join(named[:-1])} and {named[-1]}"
            reads = f" (the protocol reads the first {len(used)} passage(s))" if used else ""
            tokens = "token" if max(limit, 0) == 1 else "tokens"
            if exact is None:  # counted again past the limit (up to moot's own), for the fix to say how much
                needed = IMAGE_TOKENS * len(task.images) + sum(
                    least_tokens(text, MAX_INPUT_TOKENS) * uses for _, text, uses in texts if uses and text
                )
            return (
                f"{what} alone {'come' if len(named) > 1 else 'comes'} to more than {max(limit, 0):,} {tokens}, more "
                f"than {who}'s prompt may hold ({why}){reads}: "
                + fix.format(needed=needed, total_needed=needed * sharing)
            )
    return None
