"""Confidence read from token log-probabilities instead of stated by the model.

Small models state a confidence that carries little information (most answers at the ceiling), so
moot reads two signals from the model's own token probabilities, for typed turns whose spec has a
:class:`~moot.core.spec.Probe`:

- ``answer_prob``: the probability the model gave the tokens of its answer, at the point where it
  wrote them (the product of their probabilities). It costs nothing: it is in the reply's own
  log-probabilities.
- ``seq_prob``: the geometric mean of the probabilities of all the reply's tokens, exp(-ANLL): how
  sure the model was of the whole reasoning (the difficulty signal of budget allocation). Free too.
- ``p_true``: CISC's self-check (Taubenfeld et al., 2025, as their code does it: the ``BINARY``
  prompt of google-research ``cisc/src/confidence_extraction.py``, character for character). The
  reply is cut right after the answer; in the same assistant turn a newline, ``Now I will rate my
  confidence in the proposed answer as either 0 or 1.``, a newline and ``Proposed confidence: (``
  are appended and one greedy token is generated; ``p_true = sigmoid(logprob("1") - logprob("0"))``.
  One more call, mostly served from the server's prompt cache.

Both are pure functions here; the engine makes the calls.
"""

from __future__ import annotations

import math
import re

from moot.models.base import Message, TokenLogprob
from moot.stats import total

#: The authors' ``ConfidenceExtractionType.BINARY`` prompt, exactly (a newline before each line).
SELF_CHECK_PROMPT = "\nNow I will rate my confidence in the proposed answer as either 0 or 1.\nProposed confidence: ("


def _value_span(raw: str, field: str) -> tuple[int, int] | None:
    """Where the value of ``field`` stands in a JSON reply: [start, end) of its characters (inside the
    quotes for a string), or None. The last occurrence wins (the reasoning before it may quote it)."""
    matches = list(re.finditer(r'(?<!\\)"' + re.escape(field) + r'"\s*:\s*', raw))
    if not matches:
        return None
    start = matches[-1].end()
    if start < len(raw) and raw[start] == '"':
        end = start + 1
        while end < len(raw) and not (raw[end] == '"' and raw[end - 1] != "\\"):
            end += 1
        return (start + 1, end) if end > start + 1 else None
    m = re.match(r"[^,}\s]+", raw[start:])
    return (start, start + m.end()) if m else None


def answer_probability(raw: str, tokens: list[TokenLogprob] | None, field: str = "answer") -> float | None:
    """The probability of the answer's tokens as the model generated them, or None when the tokens
    do not spell the reply or the answer cannot be found.

    The tokens are aligned to the reply by where the reply stands in their concatenation: llama.cpp
    can report a token before the first content and a closing newline after the last."""
    if not tokens or not raw:
        return None
    shift = "".join(t.token for t in tokens).find(raw)
    span = _value_span(raw, field)
    if shift < 0 or span is None:
        return None
    start, end = span[0] + shift, span[1] + shift
    offset, total, used = 0, 0.0, False
    for t in tokens:
        t_start, offset = offset, offset + len(t.token)
        if offset > start and t_start < end:
            total += t.logprob
            used = True
        if t_start >= end:
            break
    return math.exp(total) if used else None


def self_check_messages(messages: list[Message], raw: str, field: str = "answer") -> list[Message] | None:
    """The self-check request's messages: the turn's own, then the reply cut right after its answer
    with the rating prompt appended, as the same assistant turn. None if the answer is not found."""
    span = _value_span(raw, field)
    if span is None:
        return None
    end = span[1] + (1 if span[1] < len(raw) and raw[span[1]] == '"' else 0)
    return [*messages, Message(role="assistant", content=raw[:end] + SELF_CHECK_PROMPT)]


def p_true(tokens: list[TokenLogprob] | None) -> float | None:
    """sigmoid(logprob("1") - logprob("0")) of the one generated token's alternatives. A digit missing
    from the alternatives is taken at the least likely listed one (an upper bound); both missing:
    None."""
    if not tokens:
        return None
    top = dict(tokens[0].top)
    top.setdefault(tokens[0].token, tokens[0].logprob)
    one, zero = top.get("1"), top.get("0")
    if one is None and zero is None:
        return None
    floor = min(top.values())
    diff = (one if one is not None else floor) - (zero if zero is not None else floor)
    return 1.0 / (1.0 + math.exp(-diff))


def sequence_probability(tokens: list[TokenLogprob] | None) -> float | None:
    """exp(mean log-probability) of the generated tokens, or None without tokens."""
    if not tokens:
        return None
    return math.exp(total(t.logprob for t in tokens) / len(tokens))
