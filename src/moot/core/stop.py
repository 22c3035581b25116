"""Stop conditions: small objects checked between rounds, combined with ``|`` (any) and ``&`` (all).

    MaxRounds(3) | Consensus(0.8) | TokenBudget(20_000) | Timeout(60)

Each returns the reason it fires (which becomes the result's ``stop_reason``) or None. In YAML a
condition is the same expression as a string, parsed safely (no ``eval``):
``stop: "max_rounds(3) | consensus(0.8) & stable_answers()"`` (``&`` binds tighter than ``|``),
of at most :data:`MAX_TERMS` conditions in parentheses at most :data:`MAX_DEPTH` deep.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from moot.core.answers import answer_of

if TYPE_CHECKING:
    from moot.core.state import DebateState, RoundPlan


class StopCondition(ABC):
    """Base of every condition. ``check`` is pure: it reads the state, it changes nothing."""

    @abstractmethod
    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        """The reason to stop (the result's ``stop_reason``), or None to go on."""

    @abstractmethod
    def expr(self) -> str:
        """The condition as the expression :func:`parse_stop` reads back."""

    @property
    def reads_answers(self) -> bool:
        """Whether the condition reads what was said (a round's answers, a moderator's verdict).
        Conditions on counts, tokens and time do not: they never make an earlier round useful."""
        return True

    def __or__(self, other: StopCondition) -> AnyOf:
        return AnyOf(_flat([self, other], AnyOf))

    def __and__(self, other: StopCondition) -> AllOf:
        return AllOf(_flat([self, other], AllOf))

    def __str__(self) -> str:
        return self.expr()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StopCondition) and self.expr() == other.expr()

    def __hash__(self) -> int:
        return hash(self.expr())


def _flat(parts: list[StopCondition], kind: type[AnyOf] | type[AllOf]) -> list[StopCondition]:
    """``parts`` with each one of ``kind`` replaced by its own conditions, in one pass: the parser
    gathers every operand of a chain first, so ``a | b | ... | z`` is one list built once, not a
    new list per ``|`` (quadratic: 70,000 terms took seconds). ``x | y`` in code still makes a new
    list, so that neither operand changes."""
    flat: list[StopCondition] = []
    for part in parts:
        if isinstance(part, kind):
            flat.extend(part.conditions)
        else:
            flat.append(part)
    return flat


@dataclass(eq=False)
class AnyOf(StopCondition):
    conditions: list[StopCondition]

    @property
    def reads_answers(self) -> bool:
        return any(c.reads_answers for c in self.conditions)

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        for cond in self.conditions:
            if (reason := cond.check(state, spec)) is not None:
                return reason
        return None

    def expr(self) -> str:
        return " | ".join(c.expr() for c in self.conditions)


@dataclass(eq=False)
class AllOf(StopCondition):
    conditions: list[StopCondition]

    @property
    def reads_answers(self) -> bool:
        return any(c.reads_answers for c in self.conditions)

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        reasons = []
        for cond in self.conditions:
            reason = cond.check(state, spec)
            if reason is None:
                return None
            reasons.append(reason)
        return "+".join(reasons)

    def expr(self) -> str:
        return " & ".join(f"({c.expr()})" if isinstance(c, AnyOf) else c.expr() for c in self.conditions)


def _count(name: str, value: Any) -> None:
    """A whole number of at least 1 (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} takes a whole number of at least 1, not {value!r}")


def _share(name: str, value: Any) -> None:
    """A share of the answers: above 0, at most 1 (a threshold over 1 could never be reached)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"{name} takes a share above 0 and at most 1, not {value!r}")


def _field(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} takes the answer's field as a quoted name (e.g. 'answer'), not {value!r}")


def _with_field(head: str, answer_field: str) -> str:
    """``name(x)``, or ``name(x, 'field')`` for a field other than ``answer``."""
    return f"{head}, {answer_field!r})" if answer_field != "answer" else f"{head})"


@dataclass(eq=False)
class MaxRounds(StopCondition):
    n: int

    def __post_init__(self) -> None:
        _count("max_rounds", self.n)

    @property
    def reads_answers(self) -> bool:
        return False

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        return "max_rounds" if state.round_count >= self.n else None

    def expr(self) -> str:
        return f"max_rounds({self.n})"


@dataclass(eq=False)
class AllFailed(StopCondition):
    """Every turn of the last round failed: the backends are failing, spend nothing more on them."""

    @property
    def reads_answers(self) -> bool:
        return False

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        rounds = state.result.rounds
        return "all_failed" if rounds and not any(t.ok for t in rounds[-1].turns) else None

    def expr(self) -> str:
        return "all_failed()"


def _last_answers(state: DebateState, answer_field: str) -> list[str]:
    if not state.result.rounds:
        return []
    answers = [answer_of(t, answer_field) for t in state.result.rounds[-1].turns]
    return [a for a in answers if a is not None]


@dataclass(eq=False)
class Consensus(StopCondition):
    """The share of the last round's answers that agree is at least ``threshold``."""

    threshold: float = 1.0
    answer_field: str = "answer"

    def __post_init__(self) -> None:
        _share("consensus", self.threshold)
        _field("consensus", self.answer_field)

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        answers = _last_answers(state, self.answer_field)
        if len(answers) < 2:
            return None
        top = Counter(answers).most_common(1)[0][1]
        return "consensus" if top / len(answers) >= self.threshold else None

    def expr(self) -> str:
        return _with_field(f"consensus({self.threshold:g}", self.answer_field)


@dataclass(eq=False)
class StableAnswers(StopCondition):
    """No participant changed its answer since the previous round."""

    answer_field: str = "answer"

    def __post_init__(self) -> None:
        _field("stable_answers", self.answer_field)

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        rounds = state.result.rounds
        if len(rounds) < 2:
            return None
        last = {t.speaker: answer_of(t, self.answer_field) for t in rounds[-1].turns}
        prev = {t.speaker: answer_of(t, self.answer_field) for t in rounds[-2].turns}
        compared = [s for s, a in last.items() if a is not None]
        if not compared or any(prev.get(s) != last[s] for s in compared):
            return None
        return "stable_answers"

    def expr(self) -> str:
        return f"stable_answers({self.answer_field!r})" if self.answer_field != "answer" else "stable_answers()"


@dataclass(eq=False)
class ModeratorVerdict(StopCondition):
    """A moderator's typed turn in the last round says stop: a true ``field`` (e.g. ``conclude``),
    or a ``confidence`` above ``threshold`` when ``field`` names a number."""

    speaker: str = "moderator"
    field: str = "conclude"
    threshold: float | None = None

    def __post_init__(self) -> None:
        for value in (self.speaker, self.field):
            if not isinstance(value, str) or not value:
                raise ValueError(f"moderator takes the speaker and its field as quoted names, not {value!r}")
        if self.threshold is not None and (
            isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float)
        ):
            raise ValueError(f"moderator's threshold is a number, not {self.threshold!r}")

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        if not state.result.rounds:
            return None
        for turn in state.result.rounds[-1].turns:
            if turn.speaker != self.speaker or not turn.ok or turn.parsed is None:
                continue
            value = turn.parsed.get(self.field)
            if self.threshold is None:
                fired = value is True or (isinstance(value, str) and value.strip().lower() in {"yes", "true"})
            else:
                fired = isinstance(value, int | float) and not isinstance(value, bool) and value > self.threshold
            if fired:
                return "moderator"
        return None

    def expr(self) -> str:
        args = [repr(self.speaker), repr(self.field)] + ([f"{self.threshold:g}"] if self.threshold is not None else [])
        return f"moderator({', '.join(args)})"


@dataclass(eq=False)
class TokenBudget(StopCondition):
    max_tokens: int

    def __post_init__(self) -> None:
        _count("token_budget", self.max_tokens)

    @property
    def reads_answers(self) -> bool:
        return False

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        return "token_budget" if state.result.usage.total_tokens >= self.max_tokens else None

    def expr(self) -> str:
        return f"token_budget({self.max_tokens})"


@dataclass(eq=False)
class CallBudget(StopCondition):
    """Stop before a round that, with the decision, would exceed ``max_calls`` model calls."""

    max_calls: int

    def __post_init__(self) -> None:
        _count("call_budget", self.max_calls)

    @property
    def reads_answers(self) -> bool:
        return False

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        needed = spec.round_calls() + spec.decision_calls
        return "call_budget" if state.result.llm_calls + needed > self.max_calls else None

    def expr(self) -> str:
        return f"call_budget({self.max_calls})"


@dataclass(eq=False)
class Timeout(StopCondition):
    """Stop starting rounds after ``seconds`` (the hard limit that cancels calls is the budget's)."""

    seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, int | float) or not self.seconds > 0:
            raise ValueError(f"timeout takes seconds above 0, not {self.seconds!r}")

    @property
    def reads_answers(self) -> bool:
        return False

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        return "timeout" if state.elapsed() >= self.seconds else None

    def expr(self) -> str:
        return f"timeout({self.seconds:g})"


@dataclass(eq=False)
class Never(StopCondition):
    """Only the round cap and the budgets end the debate."""

    @property
    def reads_answers(self) -> bool:
        return False

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        return None

    def expr(self) -> str:
        return "never()"


def beta_mode_probability(v1: int, v2: int) -> float:
    """P(p1 > p2) for Beta(v1+1, v2+1) posteriors of the two leading answers' shares
    (Adaptive-Consistency's stopping rule, Aggarwal et al. 2023), exactly:
    1 - I_0.5(v1+1, v2+1) = P(Binomial(v1+v2+1, 1/2) <= v1)."""
    n = v1 + v2 + 1
    return float(sum(math.comb(n, j) for j in range(v1 + 1)) / 2**n)


@dataclass(eq=False)
class Settled(StopCondition):
    """Adaptive-Consistency's rule over every answer given so far (all rounds): stop once the
    leading answer is the mode with probability at least ``threshold`` under the Beta posterior of
    the two leading counts. With one new sample a round (``round_robin``), this is sampling until
    the plurality is settled."""

    threshold: float = 0.95
    answer_field: str = "answer"

    def __post_init__(self) -> None:
        _share("settled", self.threshold)
        _field("settled", self.answer_field)

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        answers = [answer_of(t, self.answer_field) for r in state.result.rounds for t in r.turns]
        counts = Counter(a for a in answers if a is not None).most_common(2)
        if not counts:
            return None
        v1, v2 = counts[0][1], counts[1][1] if len(counts) > 1 else 0
        return "settled" if beta_mode_probability(v1, v2) >= self.threshold else None

    def expr(self) -> str:
        return _with_field(f"settled({self.threshold:g}", self.answer_field)


CONDITIONS: dict[str, type[StopCondition]] = {
    "all_failed": AllFailed,
    "max_rounds": MaxRounds,
    "consensus": Consensus,
    "settled": Settled,
    "stable_answers": StableAnswers,
    "moderator": ModeratorVerdict,
    "token_budget": TokenBudget,
    "call_budget": CallBudget,
    "timeout": Timeout,
    "never": Never,
}

C = TypeVar("C", bound=type[StopCondition])


def register_stop(name: str) -> Callable[[C], C]:
    """Class decorator: make a condition of your own readable by name in expressions (YAML
    protocol files, ``stop=`` strings, a spec read back from JSON). Its ``expr()`` must give
    ``name(args...)``, which :func:`parse_stop` turns back into ``cls(*args)``::

        @register_stop("confident_answers")
        @dataclass(eq=False)
        class ConfidentAnswers(StopCondition):
            min_prob: float = 0.9
            def check(self, state: DebateState, spec: RoundPlan) -> str | None: ...
            def expr(self) -> str:
                return f"confident_answers({self.min_prob})"
    """
    if not re.fullmatch(r"[a-z_]+", name):
        raise ValueError(f"stop condition name {name!r}: use lowercase letters and underscores, e.g. 'my_condition'")

    def register(cls: C) -> C:
        known = CONDITIONS.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"stop condition {name!r} is already {known.__module__}.{known.__qualname__}")
        CONDITIONS[name] = cls
        return cls

    return register


_TOKEN = re.compile(
    r"\s*(?:(?P<num>-?\d+(?:\.\d+)?(?:_\d+)*)|(?P<str>'[^']*'|\"[^\"]*\")|(?P<name>[a-z_]+)|(?P<op>[|&(),]))"
)


#: How deep an expression's parentheses may nest: far past any condition a person writes (``&``
#: binds tighter than ``|``, so any combination can be written with none), well short of Python's
#: recursion limit (about 1,000 frames) for the parser, which takes three frames a level.
MAX_DEPTH = 32
#: How many conditions one expression may combine: far past any a person writes, and a bound on
#: what each check between rounds reads.
MAX_TERMS = 256


class StopParseError(ValueError):
    pass


def _shown(text: str) -> str:
    """The expression as an error quotes it: its start, when it is long."""
    return repr(text if len(text) <= 60 else text[:59] + "…")


def parse_stop(text: str) -> StopCondition:
    """Parse ``"max_rounds(3) | consensus(0.8) & stable_answers()"`` without ``eval``, in time
    linear in its length. An expression over :data:`MAX_DEPTH` or :data:`MAX_TERMS` is a
    :class:`StopParseError`, as a syntax error is."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    shown = _shown(text)
    # The limits are checked as the tokens are read, without recursion, so that an expression over
    # them is refused at the token that goes over (before the rest is read) and the parser below,
    # which recurses once per level of parentheses, never goes deeper than MAX_DEPTH levels. A "("
    # after a name opens the call's arguments; any other groups.
    terms = depth = 0
    groups: list[bool] = []  # for each open "(": whether it groups
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise StopParseError(f"cannot read stop condition {shown} at position {pos}: {text[pos : pos + 12]!r}")
        kind = m.lastgroup or ""
        token = (kind, m.group(kind))
        if kind == "name":
            terms += 1
            if terms > MAX_TERMS:
                raise StopParseError(
                    f"in stop condition {shown}: more than {MAX_TERMS} conditions; combine at most {MAX_TERMS}"
                )
        elif token == ("op", "("):
            groups.append(not tokens or tokens[-1][0] != "name")
            depth += int(groups[-1])
            if depth > MAX_DEPTH:
                raise StopParseError(
                    f"in stop condition {shown}: parentheses nest deeper than {MAX_DEPTH} levels; remove redundant ones"
                )
        elif token == ("op", ")") and groups:
            depth -= int(groups.pop())
        tokens.append(token)
        pos = m.end()
    items = tokens
    i = 0

    def peek() -> tuple[str, str] | None:
        return items[i] if i < len(items) else None

    def take(expected: str | None = None) -> tuple[str, str]:
        nonlocal i
        tok = peek()
        if tok is None or (expected is not None and tok[1] != expected):
            raise StopParseError(
                f"in stop condition {shown}: expected {expected or 'more'}, found {tok[1] if tok else 'the end'}"
            )
        i += 1
        return tok

    def atom() -> StopCondition:
        tok = take()
        if tok == ("op", "("):
            inner = any_of()
            take(")")
            return inner
        if tok[0] != "name":
            raise StopParseError(f"in stop condition {shown}: expected a condition name, found {tok[1]!r}")
        cls = CONDITIONS.get(tok[1])
        if cls is None:
            raise StopParseError(f"unknown stop condition {tok[1]!r}; known: {', '.join(CONDITIONS)}")
        take("(")
        args: list[Any] = []
        while peek() is not None and peek() != ("op", ")"):
            kind, value = take()
            if kind == "num":
                number = float(value.replace("_", ""))
                args.append(int(number) if number.is_integer() and "." not in value else number)
            elif kind == "str":
                args.append(value[1:-1])
            else:
                raise StopParseError(
                    f"in stop condition {shown}: bad argument {value!r}; give a number (consensus(0.6)) or a quoted "
                    "name (moderator('moderator', 'conclude'))"
                )
            if peek() == ("op", ","):
                take(",")
        take(")")
        try:
            return cls(*args)
        except TypeError:
            raise StopParseError(f"wrong arguments for {tok[1]}(...) in {shown}") from None
        except ValueError as exc:
            raise StopParseError(f"in stop condition {shown}: {exc}") from None

    def all_of() -> StopCondition:
        parts = [atom()]
        while peek() == ("op", "&"):
            take("&")
            parts.append(atom())
        return parts[0] if len(parts) == 1 else AllOf(_flat(parts, AllOf))

    def any_of() -> StopCondition:
        parts = [all_of()]
        while peek() == ("op", "|"):
            take("|")
            parts.append(all_of())
        return parts[0] if len(parts) == 1 else AnyOf(_flat(parts, AnyOf))

    result = any_of()
    if peek() is not None:
        raise StopParseError(f"in stop condition {shown}: unexpected {peek()[1]!r}")  # type: ignore[index]
    return result


def coerce_stop(value: Any) -> StopCondition | None:
    if value is None or isinstance(value, StopCondition):
        return value
    if isinstance(value, str):
        return parse_stop(value)
    raise StopParseError('stop must be an expression string such as "max_rounds(3) | consensus(0.8)"')
