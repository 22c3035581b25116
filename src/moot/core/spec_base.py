"""What every part of a protocol spec shares: its error (:class:`SpecError`, whose message names the
field and the fix) and the prompt templates' placeholders, rendered and checked."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: Placeholders every turn template may use.
TURN_FIELDS = frozenset(
    {
        "question",
        "context",
        "context_block",
        "context_json",
        "cite",
        "using_context",
        "history",
        "round",
        "rounds",
        "name",
        "role",
        "goal",
        "stance",
        "style",
        "persona_json",
        "max_tokens",
    }
)
#: Placeholders a decision template may use.
DECISION_FIELDS = frozenset(
    {
        "question",
        "context",
        "context_json",
        "cite",
        "using_context",
        "answers",
        "transcript",
        "rounds",
        "max_tokens",
        "candidates",
        "responses",
    }
)
#: What ``{cite}`` says, after a space, when the task has context passages (numbered [1], [2]... in
#: ``{context}``); without passages it is empty: no turn is asked to cite passages it was not given.
CITE = "Cite the context passages you rely on as [n]."


#: The most participants one debate may have (``vote@K``'s K, a preset's ``agents=``/``k=``, a spec's
#: list). The literature's largest panels sample tens of agents; this leaves room for far more, and
#: bounds what one request can make the process build (10 000 agents took 6 s and 190 MB before a
#: single call, a million would take minutes and gigabytes).
MAX_PARTICIPANTS = 1000


class SpecError(ValueError):
    """A protocol spec is invalid. The message names the field and the fix."""


def check_participant_count(n: int, what: str) -> None:
    """Refuse more than :data:`MAX_PARTICIPANTS` participants, before any is built."""
    if n > MAX_PARTICIPANTS:
        raise SpecError(
            f"{what} asks {n:,} participants; a debate takes at most {MAX_PARTICIPANTS:,} "
            "(run several debates, or a smaller vote)"
        )


class RoutingError(SpecError, KeyError):
    """``models=`` names a participant or role the spec does not have (a ``KeyError`` too, as it was)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def render(template: str, values: dict[str, Any]) -> str:
    """Replace ``{name}`` placeholders; other braces (JSON examples) are left alone."""

    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        return str(values[key]) if key in values else match.group(0)

    return PLACEHOLDER.sub(sub, template)


#: How many times one template may use a placeholder: each use repeats its value (a question, the
#: history) in the prompt, so a template repeating ``{question}`` a thousand times made a 20-million-
#: character prompt of a 20,000-character question.
MAX_PLACEHOLDER_USES = 4


def check_template(template: str, allowed: frozenset[str], where: str) -> None:
    used = Counter(m.group(1) for m in PLACEHOLDER.finditer(template))
    unknown = sorted(set(used) - allowed)
    if unknown:
        raise SpecError(
            f"{where} uses unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; "
            f"allowed: {', '.join('{' + a + '}' for a in sorted(allowed))}"
        )
    over = sorted(name for name, n in used.items() if n > MAX_PLACEHOLDER_USES)
    if over:
        raise SpecError(
            f"{where} uses {', '.join('{' + o + '} ' + str(used[o]) + ' times' for o in over)}; each placeholder "
            f"may appear at most {MAX_PLACEHOLDER_USES} times in a prompt (each use repeats its whole value)"
        )
