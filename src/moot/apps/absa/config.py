"""What the ABSA pipeline is asked (its configuration, from a conditions file) and what it returns
(each stage's result), as typed values (:mod:`moot.apps.absa.pipeline` runs it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moot.apps.absa.types import (
    AspectHint,
    ATEOutput,
    ATEReview,
    ATSAOutput,
    ATSAReview,
    DebateReviewContext,
    MappingStats,
    ModeratorOutput,
    OverrideResult,
    OverrideThresholds,
    PatchHints,
    Stage2Result,
    ValidatorOutput,
)
from moot.core.types import DebateResult, Persona
from moot.files import first_error, load_yaml, read_text

# ------------------------------------------------------------------------------------- config


class InjectionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strategy: Literal["during_debate_one_shot"] = "during_debate_one_shot"
    trigger: Literal["deadlock_obs2of4"] = "deadlock_obs2of4"
    allow_multiple_injections: bool = False
    #: How many past cases one injection adds.
    top_k: int = Field(default=3, ge=1)


class DebateSettings(BaseModel):
    """``pipeline.debate`` of the seeds' experiment and conditions files."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    variant: Literal["patch", "panel"] = "patch"
    #: Rounds (default: patch 1, panel 2).
    rounds: int | None = Field(default=None, ge=1)
    #: With an injection: the most rounds a deadlocked debate may run (seed 002's conditions).
    max_rounds: int | None = Field(default=None, ge=1)
    order: list[str] | None = None
    personas: dict[str, Persona] | None = None
    injection: InjectionConfig | None = None
    #: The store of resolved past cases (JSONL); default: the shipped one.
    memory: str | None = None


class AbsaConfig(BaseModel):
    """A pipeline configuration: the seeds' keys (``enable_debate``, ``enable_debate_override``,
    ``pipeline.debate``, ``debate_override``) as written."""

    model_config = ConfigDict(extra="forbid")

    name: str = "full"
    enable_debate: bool = True
    enable_debate_override: bool = True
    debate: DebateSettings = Field(default_factory=DebateSettings)
    #: Thresholds inline, or ``debate_override_thresholds``: a JSON file (seed 001 §5.1).
    debate_override: OverrideThresholds | None = None
    debate_override_thresholds: str | None = None
    max_tokens: int = Field(default=400, ge=16)
    temperature: float | None = None

    @property
    def debate_on(self) -> bool:
        return self.enable_debate and self.debate.enabled

    def thresholds(self, base: Path | None = None) -> OverrideThresholds:
        if self.debate_override is not None:
            return self.debate_override
        if self.debate_override_thresholds:
            path = Path(self.debate_override_thresholds)
            return OverrideThresholds.load(path if path.is_absolute() or base is None else base / path)
        return OverrideThresholds.load()

    @classmethod
    def load(cls, path: str | Path) -> AbsaConfig:
        """A YAML file: this model's keys, the seeds' ``pipeline: {debate: ...}`` nesting included."""
        p = Path(path)
        try:
            data = load_yaml(read_text(p, "ABSA config")) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"ABSA config {str(p)!r} is not valid YAML: {' '.join(str(exc).split())}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{p}: an ABSA config is a mapping of keys")
        pipeline = data.pop("pipeline", None) or {}
        if not isinstance(pipeline, dict) or set(pipeline) - {"debate"}:
            raise ValueError(f"{p}: pipeline: may only hold debate:")
        # Where the file wrote a debate key: an error names it there (pipeline.debate.variant).
        debate_at = "pipeline.debate" if "debate" in pipeline and "debate" not in data else "debate"
        if "debate" in pipeline:
            data["debate"] = {**(data.get("debate") or {}), **pipeline["debate"]}
        data.setdefault("name", p.stem)
        try:
            config = cls.model_validate(data)
        except ValidationError as exc:
            err = first_error(exc)
            where = ".".join(str(x) for x in err["loc"])
            if where == "debate" or where.startswith("debate."):
                where = debate_at + where.removeprefix("debate")
            raise ValueError(f"{p}: {where}: {err['msg']}") from None
        if config.debate_override_thresholds and not Path(config.debate_override_thresholds).is_absolute():
            config.debate_override_thresholds = str(p.parent / config.debate_override_thresholds)
        return config


# ------------------------------------------------------------------------------------ results


class Stage1(BaseModel):
    ate: ATEOutput
    atsa: ATSAOutput
    validator: ValidatorOutput | None = None


class InjectionRecord(BaseModel):
    round: int
    observations: dict[str, bool]
    cases: list[dict[str, Any]]


class DebateOutcome(BaseModel):
    variant: Literal["patch", "panel"]
    transcript: DebateResult
    summary: dict[str, Any] | None = None
    judge_valid: bool = False
    judge_problems: list[str] = Field(default_factory=list)
    review_context: DebateReviewContext | None = None
    hints: PatchHints | None = None
    injections: list[InjectionRecord] = Field(default_factory=list)

    @property
    def aspect_hints(self) -> dict[str, list[AspectHint]]:
        source = self.review_context if self.review_context is not None else self.hints
        return source.aspect_hints if source is not None else {}

    @property
    def mapping(self) -> tuple[MappingStats, dict[str, int]] | None:
        source = self.review_context if self.review_context is not None else self.hints
        return None if source is None else (source.mapping_stats, source.mapping_fail_reasons)


class Stage2(BaseModel):
    ate_review: ATEReview | None = None
    atsa_review: ATSAReview | None = None
    applied: Stage2Result
    override: OverrideResult | None = None


class AbsaResult(BaseModel):
    """Every stage of one sentence, what it cost and what went wrong."""

    sentence: str
    config: str
    stage1: Stage1
    debate: DebateOutcome | None = None
    stage2: Stage2
    moderator: ModeratorOutput
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    errors: list[str] = Field(default_factory=list)
