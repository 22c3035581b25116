"""One turn's reply: the call (typed, with at most one repair, when its format names a schema), the
text shown, the confidence signals and CISC's self-check (the spec's probe), and what the turn
records of it (calls, cache hits, attempts, finish reason, usage, the warnings of a reply cut at its
limit). :class:`~moot.core.engine.Engine` makes the turn, emits its events and records its errors."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from moot.core.ledger import CallLedger, TurnCalls
from moot.core.probes import answer_probability, p_true, self_check_messages, sequence_probability
from moot.core.spec import Probe, TurnFormat
from moot.core.types import DebateResult, Turn
from moot.models.base import (
    BaseChatModel,
    ChatRequest,
    ChatResponse,
    Message,
    ModelError,
    RetryCallback,
    TokenCallback,
    Usage,
    trim_to_tokens,
)
from moot.secrets import redact
from moot.structured import complete_structured, dumps_compact, get_schema, get_view


async def fill(
    turn: Turn,
    res: DebateResult,
    *,
    model: BaseChatModel,
    request: ChatRequest,
    max_tokens: int,
    turn_format: TurnFormat | None,
    schemas: Mapping[str, type[BaseModel]],
    probe: Probe | None,
    calls: TurnCalls,
    first: bool,
    on_token: TokenCallback | None,
    on_retry: RetryCallback | None,
) -> None:
    """Call ``model`` for ``turn`` and fill the turn from its reply, warnings going to ``res``. A
    model's failure, an exhausted call budget and a cancellation are raised to the caller, with
    ``calls`` telling how many calls were made."""
    schema_name = turn_format.schema_name if turn_format is not None else None
    if turn_format is None or schema_name is None:
        calls.first(first=first)
        response = await model.complete(request, on_token, on_retry)
        responses = replies = [response]
        text = response.text
        if response.usage.completion_tokens > max_tokens:
            text = trim_to_tokens(text, max_tokens)
            turn.trimmed = True
        turn.raw = response.text
        turn.text = text
    else:
        schema = schemas.get(schema_name) or get_schema(schema_name)
        calls.first(first=first)
        # A repair request is made only if the call budget has room for it beyond the
        # round's owed first calls (reserved now, refunded if not needed).
        outcome = await complete_structured(
            model, request, schema, on_token, repair=calls.reserve_repair(), on_retry=on_retry,
            on_repair=calls.repairing,
        )  # fmt: skip
        calls.settle(len(outcome.responses))
        responses = outcome.responses
        turn.raw = responses[-1].text
        if (used := responses[-1].usage.completion_tokens) > max_tokens:
            # A typed reply is never cut (half a JSON object would not parse): it is kept, and said.
            res.warnings.append(f"{turn.speaker}'s typed reply in round {turn.round} used {used} tokens, "
                                f"over its budget of {max_tokens} (kept whole)")  # fmt: skip
        replies = responses
        if outcome.value is not None and probe is not None:
            extra = await _probe(res, probe, model, request.messages, responses[-1], turn, calls.ledger)
            if extra:
                turn.probe_usage = sum((r.usage for r in extra), Usage())
            responses = responses + extra
        if outcome.value is not None:
            turn.parsed = outcome.value
            if turn_format.view is not None:
                turn.text = get_view(turn_format.view)(outcome.value, turn.speaker)
            else:
                shown = outcome.value.get(turn_format.show_field) if turn_format.show_field else None
                turn.text = str(shown) if shown is not None else dumps_compact(outcome.value)
        else:
            turn.parse_failure = outcome.failure
    turn.calls = len(responses)
    turn.cached_calls = sum(1 for r in responses if r.cache_hit)
    turn.attempts = sum(r.attempts for r in responses)
    # The reply's, not a self-check's (CISC's one-token call always stops at its limit); a
    # reply cut at the limit and then repaired counts as cut: it had too little room.
    cut = [r for r in replies if r.finish_reason == "length"]
    turn.finish_reason = "length" if cut else replies[-1].finish_reason
    if cut:
        who = f"{turn.speaker}'s reply in round {turn.round}"
        if turn.kind == "decision":
            who = f"the decision's reply ({turn.name})"
        if turn.parse_failure is not None:  # a typed reply cut before its JSON closed, and not repaired
            ending = "gave no readable answer"
        elif replies[-1].finish_reason != "length":
            ending = "was repaired with shorter fields"
        else:
            ending = "may end mid-sentence"
        res.warnings.append(
            f"{who} stopped at its token limit of {max_tokens} (finish_reason: length), so it {ending}; "
            "raise the turn's max_tokens to give it room"
        )
    usage = Usage()
    for r in responses:
        usage = usage + r.usage
    turn.usage = usage


async def _probe(
    res: DebateResult,
    probe: Probe,
    model: BaseChatModel,
    messages: list[Message],
    reply: ChatResponse,
    turn: Turn,
    ledger: CallLedger,
) -> list[ChatResponse]:
    """Read the turn's confidence signals; with ``self_check``, make CISC's one-token call (if
    the call budget has room). Returns the extra responses (to be counted in the turn)."""
    if probe.answer_prob:
        prob = answer_probability(reply.text, reply.logprobs, probe.answer_field)
        if prob is not None:
            turn.signals["answer_prob"] = round(prob, 6)
        seq = sequence_probability(reply.logprobs)
        if seq is not None:
            turn.signals["seq_prob"] = round(seq, 6)
    if not probe.self_check:
        return []
    check = self_check_messages(messages, reply.text, probe.answer_field)
    if check is None or not ledger.reserve():
        return []
    request = ChatRequest(messages=check, max_tokens=1, temperature=0.0, logprobs=20)
    try:
        response = await model.complete(request)
    except ModelError as exc:
        # The answer stands; only its confidence is missing (and the call is not counted).
        ledger.refund()
        res.warnings.append(redact(f"{turn.speaker}'s self-check failed in round {turn.round}: {exc}"))
        return []
    value = p_true(response.logprobs)
    if value is not None:
        turn.signals["p_true"] = round(value, 6)
    return [response]
