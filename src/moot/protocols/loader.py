"""Protocols from YAML: a whole spec, a preset with parameters, or the seeds' experiment format.

Three shapes load:

1. a spec, the fields of :class:`~moot.core.spec.ProtocolSpec` (what ``moot protocols show`` prints);
2. a preset with its parameters and overrides::

       preset: society-of-minds
       with: {agents: 5, rounds: 3}
       stop: "max_rounds(3) | consensus(1)"

3. the seeds' experiment format (seeds 001/002)::

       enable_debate: true
       pipeline:
         debate:
           rounds: 2
           order: [analyst, critic, empath]
           personas: {analyst: {name: ..., role: ..., goal: ..., stance: ..., style: ...}}

Unknown keys are errors that name the key and the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from moot.core.spec import ProtocolSpec, Stage
from moot.core.types import ContextChunk, Persona, check_passages, check_question
from moot.files import InputFileError, check_text, first_error, join_pairs, load_yaml, read_text
from moot.protocols.refs import ProtocolCall, ProtocolRefError, parse_call, preset_params


class ProtocolFileError(ValueError):
    """A protocol file is wrong; the message names the file, the key and the fix."""


class InputPassage(ContextChunk):
    """A context passage as an input file writes it (a run file, a batch line, a ``.json``/``.jsonl``
    context file): ``text`` and an optional ``source``, nothing else. An unknown key (``src`` for
    ``source``) is refused by name like an unknown key anywhere else in an input file, rather than
    kept and the user's source lost. (:class:`~moot.core.types.ContextChunk` itself, the Python
    API's passage, keeps a retriever's extra metadata.)"""

    model_config = ConfigDict(extra="forbid")


def allowed_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the object at ``loc`` (a pydantic error's location, the unknown key last) may have:
    the fields of the model found by following ``loc`` from ``model`` (list indexes and mapping keys
    are passed over; a tagged union's tag picks its member)."""
    candidates = [model]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        tagged = [m for m in candidates if any(f.default == part for f in m.model_fields.values())]
        if len(candidates) > 1 and tagged:
            candidates = tagged[:1]
            continue
        fields = candidates[0].model_fields
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        found = _models_in(field.annotation) if field is not None else []
        if found:
            candidates = found
    fields = candidates[0].model_fields
    return [f.alias or name for name, f in fields.items() if not f.exclude]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``list[X]``, ``X | None``, ``dict[str, X]``, a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def unknown_key_message(
    model: type[BaseModel], loc: tuple[int | str, ...], top: str = "it", *, also: Sequence[type[BaseModel]] = ()
) -> str:
    """``unknown key 'src' in context.0; it may have text, source``: the key, where, and what fits
    there (``top`` names the object when the key is at the top level: "a line"). ``also``: other
    models whose fields the top level may hold as well (a protocol file's ``preset``, ``with``)."""
    key = loc[-1] if loc else "?"
    where = ".".join(str(x) for x in loc[:-1])
    inside, what = (f" in {where}", "it") if where else ("", top)
    keys = allowed_keys(model, loc)
    if not where:
        keys = list(dict.fromkeys([*keys, *(k for other in also for k in allowed_keys(other, loc))]))
    return f"unknown key {str(key)!r}{inside}; {what} may have {', '.join(keys)}"


class SeedInjection(BaseModel):
    """Seed 002's conditions block (memory injection; used by the ABSA pipeline)."""

    model_config = ConfigDict(extra="forbid")

    strategy: str = "during_debate_one_shot"
    trigger: str = "deadlock_obs2of4"
    allow_multiple_injections: bool = False


class SeedDebate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    rounds: int | None = Field(default=None, ge=1)
    max_rounds: int | None = Field(default=None, ge=1)
    order: list[str] | None = None
    personas: dict[str, Persona] | None = None
    injection: SeedInjection | None = None


class SeedPipeline(BaseModel):
    model_config = ConfigDict(extra="forbid")

    debate: SeedDebate = Field(default_factory=SeedDebate)


class SeedExperiment(BaseModel):
    """The experiment/conditions YAML of seeds 001 and 002."""

    model_config = ConfigDict(extra="forbid")

    enable_debate: bool = True
    enable_debate_override: bool = True
    pipeline: SeedPipeline = Field(default_factory=SeedPipeline)


class PresetFile(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    preset: str
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")


def _where(
    err: ValidationError, path: Path, model: type[BaseModel] | None = None, also: Sequence[type[BaseModel]] = ()
) -> str:
    first = first_error(err)
    loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        if model is not None:
            known = unknown_key_message(model, tuple(first["loc"]), also=also)
            return f"{path}: {known}; remove it or check its spelling"
        return f"{path}: unknown key {loc!r}; remove it or check its spelling"
    ctx = first.get("ctx") or {}
    if first["type"] == "union_tag_invalid":  # decision: {kind: votee}
        import difflib

        expected = [t.strip().strip("'") for t in str(ctx.get("expected_tags", "")).split(",") if t.strip()]
        close = difflib.get_close_matches(str(ctx.get("tag")), expected, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{path}: {loc}.{ctx.get('discriminator', 'kind').strip(chr(39))}: {ctx.get('tag')!r} is not one of " + (
            f"{', '.join(expected)}{hint}"
        )
    if first["type"] == "missing" and tuple(first["loc"])[-2:] == ("judge", "schema"):
        return f"{path}: {loc}: required: the judge's typed verdict (schema: verdict, or a schema of your own)"
    return f"{path}: {loc}: {msg}"


def spec_from_seed(experiment: SeedExperiment) -> ProtocolSpec:
    """The panel debate configured as the seeds' ``pipeline.debate`` block says."""
    from moot.protocols.presets import panel

    debate = experiment.pipeline.debate
    base = panel(rounds=debate.rounds or 2)
    participants = list(base.participants)
    if debate.personas:
        template = base.participants[0]
        participants = [
            template.model_copy(
                update={
                    "id": key,
                    "persona": persona
                    if persona.instructions
                    else persona.model_copy(update={"instructions": template.persona.instructions}),
                }
            )
            for key, persona in debate.personas.items()
        ]
    order = debate.order or [p.id for p in participants]
    known = {p.id for p in participants}
    unknown = [o for o in order if o not in known]
    if unknown:
        raise ProtocolFileError(
            f"pipeline.debate.order names {', '.join(unknown)}, which pipeline.debate.personas does not define"
        )
    return base.model_copy(
        update={
            "participants": participants,
            "stages": [Stage(speakers=order, order="sequential")],
        }
    )


def rebased_model(spec: str, base: Path) -> str:
    """A ``scripted:FILE`` model spec with a relative FILE read from ``base`` (the folder of the file
    that names it: a run file, a protocol file), wherever the command runs; any other spec as it is."""
    kind, _, rest = spec.partition(":")
    if kind != "scripted" or not rest or Path(rest).is_absolute():
        return spec
    return f"scripted:{os.path.abspath(base / rest)}"  # (absolute: a spec shown and saved elsewhere still runs)


def _with_rebased(params: dict[str, Any], base: Path) -> dict[str, Any]:
    """A preset's parameters with the ``scripted:`` model specs of its ``models`` rebased."""
    models = params.get("models")
    if isinstance(models, str):
        return {**params, "models": rebased_model(models, base)}
    if isinstance(models, list):
        return {**params, "models": [rebased_model(m, base) if isinstance(m, str) else m for m in models]}
    return params


def _models_rebased(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """A spec's raw data with its participants' and its decision's ``scripted:`` models rebased."""
    out = dict(data)
    if isinstance(out.get("participants"), list):
        out["participants"] = [
            {**p, "model": rebased_model(p["model"], base)} if isinstance(p, dict) and isinstance(p.get("model"), str)
            else p
            for p in out["participants"]
        ]  # fmt: skip
    decision = out.get("decision")
    if isinstance(decision, dict) and isinstance(decision.get("model"), str):
        out["decision"] = {**decision, "model": rebased_model(decision["model"], base)}
    return out


def _spec_file_models() -> tuple[type[BaseModel], ...]:
    """The models whose top-level keys a spec-shaped protocol file may hold besides a spec's: a
    preset and its parameters (:class:`PresetFile`: ``preset``, ``with``) and ``moot tune``'s
    evidence (:class:`~moot.protocols.tuned.TunedFile`: ``tuned``), so that an unknown key's
    message lists every key the file may have."""
    from moot.protocols.tuned import TunedFile

    return (PresetFile, TunedFile)


def load_protocol_data(data: Any, path: Path, *, from_file: bool = False) -> tuple[ProtocolSpec, SeedExperiment | None]:
    """A spec from a protocol file's data, ``path`` naming it in errors (and the folder its
    ``scripted:`` models are read from). ``from_file``: the data is the file ``path``'s, whose name
    a preset that it changes takes (an inline protocol, a request's, keeps the preset's)."""
    if not isinstance(data, dict):
        raise ProtocolFileError(f"{path}: a protocol file holds a mapping (a spec, a preset, or pipeline.debate)")
    if "tuned" in data:  # moot tune's evidence: checked, not part of the spec
        from moot.protocols.tuned import TunedEvidence

        data = dict(data)
        try:
            TunedEvidence.model_validate(data.pop("tuned"))
        except ValidationError as exc:
            raise ProtocolFileError(_where(exc, path, TunedEvidence).replace(f"{path}: ", f"{path}: tuned: ")) from None
    seed = "pipeline" in data or "enable_debate" in data or "enable_debate_override" in data
    model: type[BaseModel] = SeedExperiment if seed else ProtocolSpec
    try:
        if seed:
            experiment = SeedExperiment.model_validate(data)
            return spec_from_seed(experiment), experiment
        if "preset" in data:
            from moot.protocols import call_preset, get_preset_factory

            pf = PresetFile.model_validate(data)
            factory = get_preset_factory(pf.preset)
            try:
                spec = call_preset(pf.preset, factory, _with_rebased(pf.with_, path.parent))
            except TypeError as exc:
                raise ProtocolFileError(f"{path}: with: {exc}") from None
            overrides = _models_rebased(pf.model_extra or {}, path.parent)
            changed = sorted(set(overrides) - {"name", "description", "budget"})
            if changed and "name" not in overrides and from_file:
                # Another format than the preset's: named by its file, so that its transcripts and
                # reports are not taken for the preset's own (its budget alone leaves it the preset).
                overrides = {
                    "name": path.stem,
                    "description": f"{pf.preset} with {', '.join(changed)} changed ({path.name})",
                    **overrides,
                }
            merged = spec.model_dump(mode="json", by_alias=True) | overrides
            return ProtocolSpec.model_validate(merged), None
        return ProtocolSpec.model_validate(_models_rebased(data, path.parent)), None
    except ValidationError as exc:
        raise ProtocolFileError(_where(exc, path, model, () if seed else _spec_file_models())) from None
    except ProtocolFileError as exc:
        if str(path) in str(exc):
            raise
        raise ProtocolFileError(f"{path}: {exc}") from None
    except KeyError as exc:
        raise ProtocolFileError(f"{path}: {exc.args[0]}") from None


def load_protocol(path: str | Path) -> ProtocolSpec:
    """A protocol spec from a YAML file (any of the three shapes)."""
    return load_protocol_file(path)[0]


def _read_yaml(p: Path, what: str) -> Any:
    try:
        text = read_text(p, what)
        data = join_pairs(load_yaml(text))  # (PyYAML reads an escaped pair as two halves)
        check_text(data, f"{what} {str(p)!r}", text)  # a lone "\udfff" escape: no transcript could hold it
        return data
    except InputFileError as exc:
        raise ProtocolFileError(str(exc)) from None
    except yaml.YAMLError as exc:
        # (read as YAML, which JSON is part of: a .json file is told it is not valid JSON)
        kind = "JSON" if Path(p).suffix.lower() == ".json" else "YAML"
        raise ProtocolFileError(f"{p} is not valid {kind}: {' '.join(str(exc).split())}") from None


def load_protocol_file(path: str | Path) -> tuple[ProtocolSpec, SeedExperiment | None]:
    p = Path(path)
    return load_protocol_data(_read_yaml(p, "protocol file"), p, from_file=True)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (prompts) as literal blocks, so a dumped protocol reads like a file."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def protocol_data(spec: ProtocolSpec) -> dict[str, Any]:
    """A spec as a protocol file's data that :func:`load_protocol_data` reads back into the same spec
    (defaults left out)."""
    data = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    data = {"name": spec.name, **data}
    data["decision"] = {"kind": spec.decision.kind, **data.get("decision", {})}  # the discriminator stays
    return data


def dump_protocol(spec: ProtocolSpec) -> str:
    """YAML that :func:`load_protocol` reads back into the same spec (defaults left out)."""
    return yaml.dump(protocol_data(spec), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def _is_path(text: str) -> bool:
    """Whether ``text`` names an existing file or folder (a name too long for one names none)."""
    try:
        return Path(text).exists()
    except (OSError, ValueError):  # (a name past the system's limit; a NUL)
        return False


def names_file(name_or_path: str) -> bool:
    """Whether a protocol reference names a protocol file (not a preset): a YAML or JSON name, or an
    existing path. (A preset's name is not a file's, even if a file of that name is there.)"""
    from moot.protocols import preset_names

    if name_or_path in preset_names():
        return False
    return name_or_path.endswith((".yaml", ".yml", ".json")) or _is_path(name_or_path)


def resolve_protocol(name_or_path: str, base: Path | None = None) -> ProtocolSpec:
    """A preset name, a preset with parameters (``mad(rounds=2)``, ``vote@5``: the syntax of
    :mod:`moot.protocols.refs`, as ``moot eval`` and ``moot tune`` read it) or a protocol file path.
    ``base``: the folder of the file that names it, from which the ``scripted:`` files of its
    ``models=`` are read (None: the working folder's)."""
    from moot.protocols import get_preset, preset_names

    if name_or_path in preset_names():
        return get_preset(name_or_path)
    if names_file(name_or_path):
        return load_protocol(name_or_path)
    text = name_or_path.strip()
    try:
        call: ProtocolCall | None = parse_call(text)
    except ProtocolRefError as exc:
        if "(" in text or "@" in text:
            raise ProtocolFileError(str(exc)) from None
        call = None
    if call is None or call.name not in preset_names():
        import difflib

        name = call.name if call else text
        close = difflib.get_close_matches(name, preset_names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ProtocolFileError(
            f"no protocol preset named {name!r}{hint} and no such file; presets: "
            f"{', '.join(preset_names())} (parameters as NAME(key=value, ...), e.g. mad(rounds=2))"
        )
    if call.at == "auto":
        raise ProtocolFileError(
            f"{text!r} matches a debate's budget within a `moot eval` run; name a fixed vote here, e.g. vote@5"
        )
    if call.at == "uab":
        raise ProtocolFileError(
            f"{text!r} moves a sample budget between the inputs of a run: use it with `moot batch` or `moot eval`; "
            "one question gets a fixed vote, e.g. vote@5"
        )
    try:
        params = preset_params(call, text)
    except ProtocolRefError as exc:
        raise ProtocolFileError(str(exc)) from None
    try:
        return get_preset(call.name, **(params if base is None else _with_rebased(params, base)))
    except (TypeError, ValueError) as exc:
        raise ProtocolFileError(f"protocol {text!r}: {exc}") from None


def routing_problem(spec: ProtocolSpec, names: Iterable[str]) -> str | None:
    """Why a model per participant or role (``models:``, keyed as the engine routes them: a
    participant's id, a role, or ``decision``) names one the protocol does not have, with the ids
    and roles it has; None when every name is one of them."""
    ids = [p.id for p in spec.participants]
    roles = sorted({p.persona.role for p in spec.participants if p.persona.role} - set(ids))
    unknown = sorted(set(names) - set(ids) - set(roles) - {"decision"})
    if not unknown:
        return None
    has = f"participant id{'s' if len(ids) != 1 else ''} {', '.join(ids)}"
    if roles:
        has += f" and role{'s' if len(roles) != 1 else ''} {', '.join(roles)}"
    return (
        f"unknown participant(s) or role(s): {', '.join(unknown)}; {spec.name} has {has}: key each model by one "
        "of them (or by decision, the decision step's model)"
    )


class RunFile(BaseModel):
    """A whole run in one YAML file::

    protocol: society-of-minds      # a preset name (or mad(rounds=2)), a protocol file, or an inline spec
    with: {agents: 5}               # preset parameters (with a preset name)
    model: embedded:qwen2.5-0.5b    # the default model
    models: {moderator: openai:gpt-4o-mini}   # by participant id or role
    question: "What is 17 * 24?"
    context: ["a passage", {text: "another", source: "doc.md"}]
    reference: "408"                # optional: enables flip counts
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    protocol: str | dict[str, Any] = "affirmative-critical"
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    model: str | None = None
    models: dict[str, str] = Field(default_factory=dict)
    question: str = Field(min_length=1)
    context: list[InputPassage] = Field(default_factory=list)
    reference: str | None = None
    #: Where the file is, so that a protocol path inside it is read relative to it.
    base: Path = Field(default=Path("."), exclude=True)
    #: The run file itself, named in what it is refused for (None: made in code).
    source: Path | None = Field(default=None, exclude=True)

    @field_validator("question")
    @classmethod
    def _question(cls, v: str) -> str:
        return check_question(v)

    @field_validator("context")
    @classmethod
    def _passages(cls, v: list[InputPassage]) -> list[InputPassage]:
        check_passages(list(v))
        return v

    @model_validator(mode="after")
    def _files_beside_it(self) -> RunFile:
        """A file the run file names (a protocol, a ``scripted:`` model's replies) is read relative to
        the run file, as a protocol path always was, wherever the command runs from."""
        self.model = rebased_model(self.model, self.base) if self.model is not None else None
        self.models = {who: rebased_model(spec, self.base) for who, spec in self.models.items()}
        return self

    def spec(self) -> ProtocolSpec:
        """The run's protocol; one it cannot make, or whose participants and roles are not what
        ``models:`` names, is refused naming the run file and its key."""
        try:
            spec = self._spec()
            if (problem := routing_problem(spec, self.models)) is not None:
                raise ProtocolFileError(f"models: {problem}")
            return spec
        except ProtocolFileError as exc:
            where = f"{self.source}: " if self.source is not None else ""
            raise ProtocolFileError(f"{where}{exc}") from None

    def _spec(self) -> ProtocolSpec:
        from moot.protocols import get_preset, preset_names

        if isinstance(self.protocol, dict):
            return load_protocol_data(self.protocol, self.base / "(inline protocol)")[0]
        if self.protocol in preset_names():
            try:
                return get_preset(self.protocol, **_with_rebased(self.with_, self.base))
            except TypeError as exc:
                raise ProtocolFileError(f"with: {exc}") from None
        if self.with_:
            named = Path(self.protocol)
            if not (self.base / named).exists() and not named.suffix and len(named.parts) == 1:
                from moot.protocols import UnknownPreset, get_preset_factory

                try:  # a misspelt preset name, most likely: say which one (the with: is not the mistake)
                    get_preset_factory(self.protocol)
                except UnknownPreset as exc:
                    raise ProtocolFileError(f"protocol: {exc}") from None
            raise ProtocolFileError(
                f"with: applies to a preset name, and protocol {self.protocol!r} is not one: give the parameters in "
                "that protocol's own file, or name a preset (moot protocols lists them)"
            )
        path = Path(self.protocol)
        path = path if path.is_absolute() else self.base / path
        if not path.exists() and not self.protocol.endswith((".yaml", ".yml", ".json")):
            try:  # a preset with parameters: mad(rounds=2), vote@5
                return resolve_protocol(self.protocol, self.base)
            except ProtocolFileError as exc:
                raise ProtocolFileError(f"protocol: {exc}") from None
        return load_protocol(path)


def load_run_file(path: str | Path) -> RunFile:
    p = Path(path)
    data = _read_yaml(p, "run file")
    if not isinstance(data, dict):
        raise ProtocolFileError(f"{p}: a run file holds a mapping (protocol, model, question, ...)")
    if isinstance(data.get("context"), list):
        data["context"] = [{"text": c} if isinstance(c, str) else c for c in data["context"]]
    try:
        return RunFile.model_validate({**data, "base": p.parent, "source": p})
    except ValidationError as exc:
        raise ProtocolFileError(_where(exc, p, RunFile)) from None
