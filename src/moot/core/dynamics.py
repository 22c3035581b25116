"""Debate-dynamics metrics (after DebateLLM): what the debate did to the answers, round by round.

Answers are the typed, normalised answers of each turn (see ``moot.core.answers``); free-text
turns have none, so their rounds report only cost, failures and calls. With a reference answer
on the task, flips are counted: right-to-wrong (an agent talked out of a correct answer) and
wrong-to-right (an agent corrected).
"""

from __future__ import annotations

from collections import Counter

from moot.core.answers import answer_of, normalize_answer
from moot.core.types import DebateResult, Dynamics, RoundDynamics

__all__ = ["Dynamics", "RoundDynamics", "compute_dynamics"]


def compute_dynamics(result: DebateResult, answer_field: str = "answer") -> Dynamics:
    reference = normalize_answer(result.task.reference)
    out = Dynamics()
    previous: dict[str, str | None] = {}
    r2w = w2r = 0
    for rnd in result.rounds:
        answers = {t.speaker: answer_of(t, answer_field) for t in rnd.turns}
        given = [a for a in answers.values() if a is not None]
        rd = RoundDynamics(
            round=rnd.index,
            answers=answers,
            parse_failures=sum(1 for t in rnd.turns if t.parse_failure is not None),
            errors=sum(1 for t in rnd.turns if t.error is not None),
            calls=sum(t.calls for t in rnd.turns),
            prompt_tokens=sum(t.usage.prompt_tokens for t in rnd.turns),
            completion_tokens=sum(t.usage.completion_tokens for t in rnd.turns),
        )
        if given:
            top, count = Counter(given).most_common(1)[0]
            rd.majority, rd.agreement = top, round(count / len(given), 6)
        rd.changed = sum(
            1 for s, a in answers.items() if a is not None and previous.get(s) is not None and previous[s] != a
        )
        if reference is not None:
            rd.correct = sum(1 for a in given if a == reference)
            for s, a in answers.items():
                before = previous.get(s)
                if a is None or before is None:
                    continue
                if before == reference and a != reference:
                    r2w += 1
                elif before != reference and a == reference:
                    w2r += 1
        if rnd.index == 1:
            out.unique_first_answers = len(set(given))
        previous.update({s: a for s, a in answers.items() if a is not None})
        out.rounds.append(rd)
        out.parse_failures += rd.parse_failures
    if reference is not None:
        out.right_to_wrong, out.wrong_to_right = r2w, w2r
    return out
