"""``moot tune``: the best protocol for the user's own task and budget, chosen honestly.

1. The labelled items are split before anything runs (``split.json``, seeded, stored with the
   run): a tuning part and a held-out part.
2. Every candidate runs on the tuning part as one ``moot eval`` run (``tuning/``): the candidates
   share one pool of samples through the run's request cache (agent s asks what sample s of every
   vote asks), so a candidate costs only what it adds.
3. The choice is made on the tuning part alone, by a stated objective: ``accuracy`` (the most
   accurate candidate within the budget) or ``cheapest`` (the cheapest within the budget whose
   accuracy is not worse than the plain vote's at that budget by more than the margin). A winner
   must beat the vote at its own budget with a paired interval above 0; when the tuning items
   cannot support that, the cheapest candidate within the margin of the most accurate is chosen
   instead, and the report says so and how many items it would take.
4. Only the choice and the vote at its budget run on the held-out part (``holdout/``): the
   confirmation is paired, and the report says how much the tuning estimate overstated it.
5. ``tuned.yaml`` is the chosen protocol as a protocol file, with its evidence (``tuned:``).

Accuracy is the expected accuracy over tie-breaks, as in the report; comparisons are paired
(:func:`moot.stats.paired_test`).
"""

from moot.eval.goal import GOAL_POINTS
from moot.eval.tune.analyse import TuneReport, analyse_tune, candidate_scores, held_before
from moot.eval.tune.choice import (
    CandidateScore,
    Choice,
    Comparison,
    NeedVote,
    Scores,
    budget_vote,
    choose,
    held_out_labels,
)
from moot.eval.tune.config import (
    DEFAULT_CANDIDATES,
    MIN_ITEMS,
    Split,
    TuneBudget,
    TuneConfig,
    TuneError,
    TuneRunError,
    check,
    free_budget_note,
    make_split,
    parse_budget,
    token_floor,
)
from moot.eval.tune.markdown import optimism_text, render_markdown
from moot.eval.tune.run import run_tune, write_outputs
from moot.eval.tune.tuned_file import tuned_file, tuned_protocol

__all__ = [
    "DEFAULT_CANDIDATES",
    "GOAL_POINTS",
    "MIN_ITEMS",
    "CandidateScore",
    "Choice",
    "Comparison",
    "NeedVote",
    "Scores",
    "Split",
    "TuneBudget",
    "TuneConfig",
    "TuneError",
    "TuneReport",
    "TuneRunError",
    "analyse_tune",
    "budget_vote",
    "candidate_scores",
    "check",
    "choose",
    "free_budget_note",
    "held_before",
    "held_out_labels",
    "make_split",
    "optimism_text",
    "parse_budget",
    "render_markdown",
    "run_tune",
    "token_floor",
    "tuned_file",
    "tuned_protocol",
    "write_outputs",
]
