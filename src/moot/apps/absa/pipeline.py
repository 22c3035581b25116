"""The ABSA debate pipeline of seeds 001 and 002, end to end, on any moot model.

1. **Stage 1** (typed LLM agents, in order): ATE (aspect terms, a sentence label, confidence),
   ATSA (a polarity per aspect, given ATE's aspects), Validator (negation / irony / contrast
   issues, a suggested label, correction proposals). A term's span is located in the sentence by
   code, not asked of the model. An agent whose reply cannot be parsed contributes no signal
   (confidence 0) and the failure is recorded.
2. **Debate** (``enable_debate``): the ``absa-patch`` (default) or ``absa-panel`` protocol on the
   engine, the Stage 1 results as the shared context. The patch judge's evidence spans are checked
   against the sentence: a span that is not an exact substring is realigned when the only
   difference is case or spacing, else the judge is asked once to repair its summary; still
   invalid, the summary is reported (``judge_problems``) and its tuples are not used.
   **Memory injection** (conditions files, strategy ``during_debate_one_shot``, trigger
   ``deadlock_obs2of4``): the debate may run up to ``max_rounds`` rounds and goes on only while it
   is deadlocked; after a round, four observations are made on its claims (a claim: a speaker
   pushing an aspect towards a polarity, dropping it or keeping it): (1) the same aspect pushed
   towards two polarities, (2) the same aspect both dropped and kept, (3) the same claims as the
   previous round, (4) mean stated confidence below 0.6. Two or more of the four is a deadlock: the
   first time (or every time with ``allow_multiple_injections``) the most similar resolved past
   cases from the memory store are added to the shared context, once, before the next round.
3. **Stage 2** (seed 001 §5): ATE and ATSA reviews (typed LLM calls given Stage 1, the validator
   and the debate review context), applied in the seed's order with the validator's proposals
   first; then the **debate override** (``enable_debate_override``) from the aspect hints.
4. **Moderator**: rules Z, B, M, C, A, D, E (no LLM).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from pydantic import BaseModel

from moot.apps.absa import protocols as absa_protocols
from moot.apps.absa.config import (
    AbsaConfig as AbsaConfig,
)
from moot.apps.absa.config import (
    AbsaResult as AbsaResult,
)
from moot.apps.absa.config import (
    DebateOutcome as DebateOutcome,
)
from moot.apps.absa.config import (
    DebateSettings as DebateSettings,
)
from moot.apps.absa.config import (
    InjectionConfig as InjectionConfig,
)
from moot.apps.absa.config import (
    InjectionRecord as InjectionRecord,
)
from moot.apps.absa.config import (
    Stage1 as Stage1,
)
from moot.apps.absa.config import (
    Stage2 as Stage2,
)
from moot.apps.absa.deadlock import (
    MEMORY_PATH as MEMORY_PATH,
)
from moot.apps.absa.deadlock import (
    MemoryStore as MemoryStore,
)
from moot.apps.absa.deadlock import (
    UntilResolved as UntilResolved,
)
from moot.apps.absa.deadlock import (
    is_deadlock as is_deadlock,
)
from moot.apps.absa.deadlock import (
    observe_deadlock as observe_deadlock,
)
from moot.apps.absa.mapping import build_review_context, load_synonyms, normalize, patch_hints
from moot.apps.absa.moderator import moderate
from moot.apps.absa.override import apply_debate_override
from moot.apps.absa.patch import apply_stage2, check_judge_summary, realign_span
from moot.apps.absa.types import (
    AspectSentiment,
    AspectTerm,
    ATEOutput,
    ATEReview,
    ATSAOutput,
    ATSAReview,
    ModeratorInput,
    ModeratorOutput,
    OverrideThresholds,
    PanelJudgeSummary,
    PanelTurn,
    PatchJudgeSummary,
    PatchTurn,
    StageSignal,
    ValidatorOutput,
    strongest_span,
)
from moot.core.engine import DebateTimeout, Engine
from moot.core.spec import ProtocolSpec
from moot.core.state import DebateState
from moot.core.types import ContextChunk, DebateResult, DebateTask, Round
from moot.models.base import BaseChatModel, ChatRequest, Message, ModelConfigError
from moot.models.registry import resolve_model
from moot.secrets import redact
from moot.structured import StructuredOutcome, complete_structured, fingerprint, restrict, truncate_lists

# ------------------------------------------------------------------------------------ prompts

ATE_PROMPT = (
    "Aspect term extraction. Sentence:\n{sentence}\n\nList the aspect terms: the features or parts of the "
    "product, dish or service that the review gives an opinion about, each copied exactly from the sentence "
    "(a noun, without particles or articles). Then the sentence's overall label (positive, negative, neutral, "
    "or mixed when it has both positive and negative opinions) and your confidence from 0 to 1. Reply as JSON."
)
ATSA_PROMPT = (
    "Aspect sentiment. Sentence:\n{sentence}\n\nAspect terms found: {aspects}\n\nGive the polarity (positive, "
    "negative or neutral) the sentence expresses about each aspect term, as meant (irony and negation read "
    "for what they mean), with a confidence from 0 to 1; then the sentence label (positive, negative, neutral "
    "or mixed) and your confidence. Reply as JSON."
)
VALIDATOR_PROMPT = (
    "Validate a sentiment annotation. Sentence:\n{sentence}\n\nStage 1 annotation:\n{stage1}\n\nList the risks "
    "in the sentence (negation, irony, contrast, sarcasm, comparison) with a severity (low, medium, high); "
    "suggest the sentence label if the annotation's is wrong (else null); propose corrections (FLIP_POLARITY "
    "with the new polarity as value, DROP_ASPECT, REVISE_SPAN with the revised term as value) and give your "
    "confidence from 0 to 1. Reply as JSON."
)
ATE_REVIEW_PROMPT = (
    "Review the aspect terms. Sentence:\n{sentence}\n\nStage 1:\n{stage1}\n\nDebate review context:\n{debate}\n\n"
    "Propose aspect_review actions: revise_span (term, new_term), drop (term), add (term, copied exactly from "
    "the sentence); an empty list if the terms are right. The validator's correction proposals are applied "
    "before your review: to keep an aspect it proposes to drop, add it. Then the sentence label and your "
    "confidence. Reply as JSON."
)
ATSA_REVIEW_PROMPT = (
    "Review the aspect sentiments. Sentence:\n{sentence}\n\nStage 1:\n{stage1}\n\nDebate review context:\n"
    "{debate}\n\nFor each aspect give a sentiment_review action: maintain, flip_polarity (with the new "
    "polarity), drop, or add (aspect_term and polarity), with a confidence. Then the sentence label (positive, "
    "negative, neutral or mixed) and your confidence. Reply as JSON."
)
SYSTEM = "You are a careful annotator of aspect-based sentiment in product and restaurant reviews (English or Korean)."


_HANGUL = re.compile(r"[\uac00-\ud7a3]")
MAX_CANDIDATES = 150
#: Bounds on the agents' lists (JSON-schema ``maxItems``): at most this many aspects from ATE, and
#: a review of Stage 1's aspects with at most this many additions. The shipped set has at most 4
#: aspects a sentence; unbounded, qwen2.5-0.5b repeated review items until max_tokens cut the reply.
MAX_ASPECTS = 6
REVIEW_ADDS = 2
#: The list fields of the agents' outputs, required in what is asked (see ``restrict``).
LIST_FIELDS = {"aspects", "aspect_sentiments", "issues", "correction_proposals", "aspect_review", "sentiment_review"}


def aspect_candidates(sentence: str) -> list[str]:
    """What an aspect term may be: the sentence's word n-grams (1 to 3 words) and, for Korean
    words, every prefix (a noun followed by its particles: ``배터리는`` gives ``배터리``). Sent as
    an enum, it makes a small model copy a term from the sentence instead of inventing one."""
    words = [w.strip(".,!?;:\"'()[]…~") for w in sentence.split()]
    words = [w for w in words if w]
    out: list[str] = []
    for i in range(len(words)):
        if _HANGUL.search(words[i]):
            out += [words[i][:k] for k in range(1, len(words[i]) + 1)]
            continue
        for n in (1, 2, 3):
            gram = words[i : i + n]
            if len(gram) == n and not any(_HANGUL.search(w) for w in gram):
                out.append(" ".join(gram))
    seen: list[str] = []
    for c in out:
        if c and c in sentence and c not in seen:
            seen.append(c)
    return seen[:MAX_CANDIDATES]


def locate(sentence: str, term: str) -> tuple[int, int] | None:
    """The first exact occurrence of ``term`` in ``sentence`` (then case-insensitive), or None."""
    i = sentence.find(term)
    if i < 0:
        i = sentence.lower().find(term.lower())
    return (i, i + len(term)) if i >= 0 and term else None


def _dump(model: BaseModel | None) -> str:
    return "null" if model is None else model.model_dump_json(exclude_none=True)


# ------------------------------------------------------------------------------------ the run


class _Counter:
    def __init__(self) -> None:
        self.calls = self.prompt = self.completion = 0

    def add(self, outcome: StructuredOutcome) -> None:
        for r in outcome.responses:
            self.calls += 1
            self.prompt += r.usage.prompt_tokens
            self.completion += r.usage.completion_tokens


class AbsaPipeline:
    """``await AbsaPipeline(config, model).run(sentence)`` -> :class:`AbsaResult`."""

    def __init__(self, config: AbsaConfig | None = None, model: str | BaseChatModel | None = None) -> None:
        self.config = config or AbsaConfig()
        self.model = resolve_model(model)
        self.synonyms = load_synonyms()
        self.thresholds = self.config.thresholds()
        injection = self.config.debate.injection
        self.memory = MemoryStore.load(self.config.debate.memory) if injection is not None else None

    async def _ask(
        self,
        prompt: str,
        schema: type[BaseModel],
        counter: _Counter,
        errors: list[str],
        what: str,
        choices: dict[str, list[str]] | None = None,
        max_items: dict[str, int] | None = None,
    ) -> Any:
        """One typed call. With ``choices``, term fields are enums of them (see
        :func:`moot.structured.restrict`) and spans are not asked for: code locates them.
        ``max_items`` bounds list fields (grammar-enforced where the backend has grammars, cut
        to length otherwise)."""
        bounds = max_items or {}
        asked = (
            restrict(schema, choices or {}, drop={"span"}, require=LIST_FIELDS, max_items=bounds)
            if choices or bounds else schema
        )  # fmt: skip
        request = ChatRequest(
            messages=[Message(role="system", content=SYSTEM), Message(role="user", content=prompt)],
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
        )
        try:
            outcome = await complete_structured(self.model, request, asked)
        except ModelConfigError:
            raise
        except Exception as exc:
            errors.append(f"{what}: {redact(str(exc))}")
            return None
        counter.add(outcome)
        if outcome.value is None:
            errors.append(f"{what}: unparsable reply ({outcome.failure.error if outcome.failure else 'no value'})")
            return None
        return schema.model_validate(truncate_lists(outcome.value, bounds))

    # -------------------------------------------------------------------------------- stage 1

    async def stage1(self, sentence: str, counter: _Counter, errors: list[str]) -> Stage1:
        candidates = aspect_candidates(sentence)
        ate = await self._ask(
            ATE_PROMPT.format(sentence=sentence), ATEOutput, counter, errors, "ATE", {"term": candidates},
            {"aspects": min(len(candidates), MAX_ASPECTS)},
        )  # fmt: skip
        if ate is None:
            ate = ATEOutput(aspects=[], sentence_label="neutral", confidence=0.0)
        ate.aspects = [a.model_copy(update={"span": locate(sentence, a.term)}) for a in ate.aspects if a.term.strip()]
        terms = [a.term for a in ate.aspects]
        atsa = await self._ask(
            ATSA_PROMPT.format(sentence=sentence, aspects=json.dumps(terms, ensure_ascii=False)),
            ATSAOutput, counter, errors, "ATSA", {"aspect_term": terms or candidates},
            {"aspect_sentiments": len(terms) or min(len(candidates), MAX_ASPECTS)},
        )  # fmt: skip
        if atsa is None:
            atsa = ATSAOutput(aspect_sentiments=[], sentence_label="neutral", confidence=0.0)
        atsa.aspect_sentiments = [
            s.model_copy(update={"span": locate(sentence, s.aspect_term)}) for s in atsa.aspect_sentiments
        ]
        stage1_json = json.dumps({"ate": ate.model_dump(), "atsa": atsa.model_dump()}, ensure_ascii=False)
        validator = await self._ask(
            VALIDATOR_PROMPT.format(sentence=sentence, stage1=stage1_json),
            ValidatorOutput,
            counter,
            errors,
            "Validator",
            max_items={"issues": MAX_ASPECTS, "correction_proposals": len(terms) + 1},
        )
        return Stage1(ate=ate, atsa=atsa, validator=validator)

    # --------------------------------------------------------------------------------- debate

    def debate_spec(self, terms: list[str]) -> ProtocolSpec:
        return debate_spec(self.config, terms)

    async def debate(self, sentence: str, s1: Stage1, counter: _Counter, errors: list[str]) -> DebateOutcome | None:
        d = self.config.debate
        terms = [a.term for a in s1.ate.aspects]
        shared = ContextChunk(
            source="stage1",
            text=json.dumps(
                {"ate": s1.ate.model_dump(), "atsa": s1.atsa.model_dump(),
                 "validator": s1.validator.model_dump() if s1.validator else None},
                ensure_ascii=False,
            ),
        )  # fmt: skip
        task = DebateTask(question=sentence, context=[shared])
        injections: list[InjectionRecord] = []

        def inject(state: DebateState, rnd: Round) -> None:
            """The engine's between-rounds step: on a deadlock, the most similar resolved past cases
            join the running debate's shared context, so the next round's turns read them."""
            if d.injection is None or self.memory is None:
                return
            if injections and not d.injection.allow_multiple_injections:
                return
            obs = observe_deadlock(state.result, d.variant, terms)
            if not is_deadlock(obs):
                return
            cases = self.memory.retrieve(sentence, terms, d.injection.top_k)
            if not cases:
                return
            state.result.task.context.append(
                ContextChunk(source="memory", text=json.dumps({"resolved_past_cases": cases}, ensure_ascii=False))
            )
            injections.append(InjectionRecord(round=rnd.index, observations=obs, cases=cases))

        engine = Engine(self.debate_spec(terms), self.model, between_rounds=inject)
        try:
            result = await engine.run(task)
        except DebateTimeout as exc:
            result = exc.result
        except ModelConfigError:
            raise
        except Exception as exc:
            errors.append(f"debate: {redact(str(exc))}")
            return None
        counter.calls += result.llm_calls
        counter.prompt += result.usage.prompt_tokens
        counter.completion += result.usage.completion_tokens
        out = DebateOutcome(variant=d.variant, transcript=result, injections=injections)
        summary = {k: v for k, v in (result.decision or {}).items() if k != "kind"} or None
        out.summary = summary
        if result.status == "failed" or summary is None:
            errors.append(f"debate: {result.error or 'no judge summary'}")
        if d.variant == "panel":
            turns = [PanelTurn.model_validate(t.parsed) for t in result.turns() if t.parsed is not None]
            judge = PanelJudgeSummary.model_validate(summary) if summary else None
            out.judge_valid = judge is not None
            out.review_context = build_review_context(turns, judge, s1.ate, s1.atsa, self.synonyms)
            return out
        patch_turns = [
            PatchTurn.model_validate({**t.parsed, "agent": t.speaker}) for t in result.turns() if t.parsed is not None
        ]
        judge_p = await self._checked_judge(sentence, terms, shared, summary, result, counter, out)
        polarities = {s.aspect_term: s.polarity for s in s1.atsa.aspect_sentiments}
        out.hints = patch_hints(patch_turns, judge_p, terms, polarities, self.synonyms)
        return out

    async def _checked_judge(
        self,
        sentence: str,
        terms: list[str],
        shared: ContextChunk,
        summary: dict[str, Any] | None,
        result: DebateResult,
        counter: _Counter,
        out: DebateOutcome,
    ) -> PatchJudgeSummary | None:
        """The patch judge's summary if its evidence spans hold (after a realignment or one repair)."""
        if summary is None:
            return None
        judge = PatchJudgeSummary.model_validate(summary)
        spans = [realign_span(sentence, s) or s for s in judge.sentence_evidence_spans]
        if spans != judge.sentence_evidence_spans:
            judge = judge.model_copy(update={"sentence_evidence_spans": spans})
        problems = check_judge_summary(sentence, judge, terms)
        if problems:
            repair = (
                absa_protocols.JUDGE_TEMPLATE.format(
                    question=sentence, context_json=json.dumps([shared.model_dump()], ensure_ascii=False),
                    transcript="\n".join(t.text or "" for t in result.turns() if t.ok),
                )
                + "\n\nYour previous summary was:\n" + judge.model_dump_json()
                + "\n\nIt has these problems:\n- " + "\n- ".join(problems)
                + "\n\nGive the corrected summary. Every evidence span must be copied exactly from the TOPIC."
            )  # fmt: skip
            request = ChatRequest(
                messages=[Message(role="system", content=absa_protocols.PATCH_JUDGE.system_prompt()),
                          Message(role="user", content=repair)],
                max_tokens=max(self.config.max_tokens, 600), temperature=self.config.temperature,
            )  # fmt: skip
            outcome = await complete_structured(self.model, request, PatchJudgeSummary)
            counter.add(outcome)
            if outcome.value is not None:
                repaired = PatchJudgeSummary.model_validate(outcome.value)
                if not check_judge_summary(sentence, repaired, terms):
                    out.summary = repaired.model_dump()
                    out.judge_valid = True
                    out.judge_problems = [f"repaired: {p}" for p in problems]
                    return repaired
            out.judge_problems = problems
            return None
        out.summary = judge.model_dump()
        out.judge_valid = True
        return judge

    # ---------------------------------------------------------------------------- stage 2 + 4

    async def run(self, sentence: str) -> AbsaResult:
        if not sentence.strip():
            raise ValueError("the sentence is empty")
        t0 = time.perf_counter()
        counter, errors = _Counter(), list[str]()
        s1 = await self.stage1(sentence, counter, errors)
        debate = await self.debate(sentence, s1, counter, errors) if self.config.debate_on else None
        context: dict[str, Any] | None = None
        if debate is not None:
            context = (
                debate.review_context.model_dump()
                if debate.review_context is not None
                else {"summary": debate.summary, "judge_valid": debate.judge_valid,
                      "aspect_hints": {k: [h.model_dump() for h in v] for k, v in debate.aspect_hints.items()}}
            )  # fmt: skip
        stage1_json = s1.model_dump_json(exclude_none=True)
        cands = aspect_candidates(sentence)
        debate_json = json.dumps(context, ensure_ascii=False) if context else "(no debate)"
        reviewed = len(
            {normalize(a.term) for a in s1.ate.aspects} | {normalize(s.aspect_term) for s in s1.atsa.aspect_sentiments}
        )
        bound = min(reviewed + REVIEW_ADDS, len(cands))
        ate_review, atsa_review = await asyncio.gather(
            self._ask(ATE_REVIEW_PROMPT.format(sentence=sentence, stage1=stage1_json, debate=debate_json),
                      ATEReview, counter, errors, "ATE review", {"term": cands, "new_term": cands},
                      {"aspect_review": bound}),
            self._ask(ATSA_REVIEW_PROMPT.format(sentence=sentence, stage1=stage1_json, debate=debate_json),
                      ATSAReview, counter, errors, "ATSA review", {"aspect_term": cands},
                      {"sentiment_review": bound}),
        )  # fmt: skip
        stage2, verdict = decide(sentence, s1, debate, ate_review, atsa_review, self.config, self.thresholds)
        return AbsaResult(
            sentence=sentence, config=self.config.name, stage1=s1, debate=debate, stage2=stage2, moderator=verdict,
            calls=counter.calls, prompt_tokens=counter.prompt, completion_tokens=counter.completion,
            elapsed_s=round(time.perf_counter() - t0, 3), errors=errors,
        )  # fmt: skip


def decide(
    sentence: str,
    s1: Stage1,
    debate: DebateOutcome | None,
    ate_review: ATEReview | None,
    atsa_review: ATSAReview | None,
    config: AbsaConfig,
    thresholds: OverrideThresholds,
) -> tuple[Stage2, ModeratorOutput]:
    """Everything after the last model call: the Stage 2 reviews applied, the override (when the
    config enables it), the moderator. Pure, so an ablation that differs only here (the override
    off, other thresholds) can be derived exactly from a finished run: :func:`rederive`."""
    applied = apply_stage2(s1.ate.aspects, s1.atsa.aspect_sentiments, s1.validator, ate_review, atsa_review,
                           sentence=sentence)  # fmt: skip
    sentiments: list[AspectSentiment] = applied.sentiments
    override = None
    if debate is not None and config.enable_debate_override:
        override = apply_debate_override(sentiments, debate.aspect_hints, thresholds, applied.aspects)
        sentiments = override.sentiments
    stage2 = Stage2(ate_review=ate_review, atsa_review=atsa_review, applied=applied, override=override)
    s2_atsa = (
        StageSignal(label=atsa_review.sentence_label, confidence=atsa_review.confidence,
                    span=strongest_span(sentiments))
        if atsa_review is not None else None
    )  # fmt: skip
    verdict = moderate(
        ModeratorInput(
            stage1_ate=s1.ate.signal(),
            stage1_atsa=s1.atsa.signal(),
            stage2_ate=ate_review.signal() if ate_review is not None else None,
            stage2_atsa=s2_atsa,
            validator=s1.validator,
            final_aspect_sentiments=sentiments,
            debate_summary=debate.summary if debate is not None and debate.judge_valid else None,
        )
    )
    return stage2, verdict


def debate_spec(config: AbsaConfig, terms: list[str]) -> ProtocolSpec:
    """The debate protocol a config runs (defaults resolved: patch 1 round EPM -> TAN -> CJ, panel
    2 rounds analyst -> critic -> empath); ``terms`` feed the deadlock stop of an injection."""
    d = config.debate
    if d.variant == "patch":
        spec = absa_protocols.absa_patch(d.rounds or 1, d.order, d.personas)
    else:
        spec = absa_protocols.absa_panel(d.rounds or 2, d.order, d.personas)
    spec = spec.model_copy(
        update={
            "budget": spec.budget.model_copy(update={"max_tokens_per_turn": config.max_tokens}),
            "temperature": config.temperature,
        }
    )
    if d.injection is not None:
        cap = d.max_rounds or d.rounds or spec.rounds
        spec = spec.model_copy(update={"rounds": cap, "stop": UntilResolved(d.variant, terms)})
    return spec


def asked_fingerprint(config: AbsaConfig) -> str:
    """A hash of what this version of moot asks the agents under ``config``: the stage prompts,
    the list bounds, the output schemas and the debate spec. ``moot absa eval`` stores it and
    refuses to resume a run under another one (its rows would mix replies asked two ways)."""
    parts: list[Any] = [
        SYSTEM, ATE_PROMPT, ATSA_PROMPT, VALIDATOR_PROMPT, ATE_REVIEW_PROMPT, ATSA_REVIEW_PROMPT,
        absa_protocols.JUDGE_TEMPLATE, MAX_ASPECTS, REVIEW_ADDS, sorted(LIST_FIELDS), config.max_tokens,
        [m.model_json_schema() for m in (ATEOutput, ATSAOutput, ValidatorOutput, ATEReview, ATSAReview)],
        debate_spec(config, ["aspect"]).model_dump(mode="json") if config.debate_on else None,
    ]  # fmt: skip
    return fingerprint(parts)


def same_calls(a: AbsaConfig, b: AbsaConfig) -> bool:
    """Whether two configs make the same model calls (they differ at most after the last call).
    The debates are compared as run, defaults resolved: ``rounds: 1`` written out and left to the
    default are the same debate."""
    tail = {"name", "enable_debate_override", "debate_override", "debate_override_thresholds", "debate"}
    if a.model_dump(exclude=tail) != b.model_dump(exclude=tail) or a.debate_on != b.debate_on:
        return False
    if not a.debate_on:
        return True

    def calls(c: AbsaConfig) -> tuple[Any, ...]:
        d = c.debate
        spec = debate_spec(c, []).model_dump(mode="json", exclude={"stop"})  # the stop follows from the injection
        return spec, d.injection.model_dump() if d.injection else None, d.memory

    return calls(a) == calls(b)


def rederive(result: AbsaResult, config: AbsaConfig, thresholds: OverrideThresholds | None = None) -> AbsaResult:
    """``result`` as ``config`` would have ended it, from the same model calls (see :func:`decide`)."""
    s2 = result.stage2
    stage2, verdict = decide(result.sentence, result.stage1, result.debate, s2.ate_review, s2.atsa_review, config,
                             thresholds or config.thresholds())  # fmt: skip
    return result.model_copy(update={"config": config.name, "stage2": stage2, "moderator": verdict})


__all__ = ["AbsaConfig", "AbsaPipeline", "AbsaResult", "AspectTerm", "MemoryStore", "observe_deadlock"]
