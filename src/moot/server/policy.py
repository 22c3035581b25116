"""What a request may ask for: a protocol, models and budgets within the server's limits.

Every refusal is a :class:`RequestError` whose message names the field and the fix. A request
can only use the models the server was started with; it can never name ``scripted:`` (reads a
file) or ``langchain:`` (imports code) specs, nor an endpoint or key; a protocol is a preset name
or an inline spec, never a file path.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from moot.core.budget import default_timeout_s, image_problem, input_problem
from moot.core.engine import Engine
from moot.core.spec import JudgeDecision, ProtocolSpec, SpecError, SynthesizeDecision
from moot.core.stop import StopParseError, coerce_stop
from moot.core.types import ContextChunk, DebateTask
from moot.files import first_error
from moot.models.base import BaseChatModel, ModelConfigError
from moot.models.images import ImageInput
from moot.models.registry import resolve_model
from moot.protocols import call_preset, closest_preset, get_preset_factory, preset_names
from moot.protocols.loader import ProtocolFileError, load_protocol_data
from moot.protocols.refs import ProtocolRefError, parse_call, preset_params
from moot.server.limits import SEED_RANGE, TEMPERATURE_RANGE
from moot.server.limits import RequestError as RequestError  # re-exported: the routes import it from here
from moot.server.schemas import DebateOptions, QualityRequest
from moot.server.settings import FORBIDDEN_IN_REQUESTS, ServerSettings


@dataclass
class Prepared:
    spec: ProtocolSpec
    task: DebateTask
    engine: Engine
    model: str


def check_model(spec: str, where: str, settings: ServerSettings) -> None:
    offered = ", ".join(settings.models)
    if spec.startswith(FORBIDDEN_IN_REQUESTS):
        raise RequestError(
            f"{where}: a request cannot name {spec.split(':', 1)[0]}: models (they read files or import code); "
            f"use one of this server's models: {offered}",
            param=where,
        )
    if spec not in settings.models:
        raise RequestError(
            f"{where}: model {spec!r} is not offered by this server; use one of: {offered} (or leave it out "
            "for the default)",
            param=where,
        )


def _number(value: Any) -> float | None:
    """A count as a request may write it: 3, 3.0 or "3" (a preset's parameters are parsed later)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _check_sizes(data: Any, where: str, settings: ServerSettings) -> None:
    """Refuse a protocol over the server's size limits before it is built: building a spec of
    20,000 agents takes the event loop for seconds, so the count is read from the request itself
    (``agents``/``k``, a ``participants`` list, ``rounds``) at any depth of an inline spec."""
    limits = settings.limits
    if isinstance(data, list):
        for i, value in enumerate(data):
            _check_sizes(value, f"{where}[{i}]", settings)
        return
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        path = f"{where}.{key}"
        number = _number(value)
        if key in ("agents", "k") and number is not None and number > limits.max_participants:
            raise RequestError(
                f"{path}: {value} agents is over this server's limit of {limits.max_participants}; ask for fewer",
                param=path,
            )
        if key == "rounds" and number is not None and number > limits.max_rounds:
            raise RequestError(
                f"{path}: {value} is over this server's limit of {limits.max_rounds} rounds; ask for fewer", param=path
            )
        # A preset's parameter (a spec's own token limits are checked with its budgets, in _capped).
        is_preset_parameter = where == "with" or where.endswith(".with")
        if key == "max_tokens" and is_preset_parameter and number is not None and number > limits.max_tokens_per_turn:
            raise RequestError(
                f"{path}: {value} is over this server's limit of {limits.max_tokens_per_turn} tokens per turn; "
                "ask for fewer",
                param=path,
            )
        if key == "participants" and isinstance(value, list) and len(value) > limits.max_participants:
            raise RequestError(
                f"{path}: {len(value)} participants is over this server's limit of {limits.max_participants}; "
                "use fewer agents",
                param=path,
            )
        _check_sizes(value, path, settings)


def _check_stop(protocol: dict[str, Any]) -> None:
    """An inline spec's ``stop`` expression, refused naming ``protocol.stop``: a syntax error, or one
    over the parser's limits (:data:`moot.core.stop.MAX_DEPTH`, :data:`~moot.core.stop.MAX_TERMS`)."""
    if "stop" not in protocol:
        return
    try:
        coerce_stop(protocol["stop"])
    except StopParseError as exc:
        raise RequestError(f"protocol.stop: {exc}", param="protocol.stop") from None


def _parameters_hint(protocol: str) -> str | None:
    """What to send instead of a preset named with its parameters in the command line's form
    (``mad(rounds=2)``, ``vote@5``, ``vote@uab(budget=4)``): here parameters go in ``with``."""
    try:
        call = parse_call(protocol)
    except ProtocolRefError:
        return None
    if call.name not in preset_names() or (call.at is None and not call.params):
        return None
    if call.at in ("uab", "auto"):
        return (
            f"{protocol!r} is a run-level vote (moot batch, moot eval): a request is one question; send a fixed "
            'vote, {"protocol": "vote", "with": {"k": 5}}'
        )
    try:
        with_ = preset_params(call, protocol)
    except ProtocolRefError as exc:
        return f"{exc}; send {json.dumps({'protocol': 'vote', 'with': {'k': 5}})}"
    example = json.dumps({"protocol": call.name, "with": with_})
    return f"give a preset's parameters in `with`: {example if len(example) <= 200 else example[:199] + '…'}"


def _preset(name: str, params: dict[str, Any]) -> ProtocolSpec:
    """A preset's spec with these parameters: made once per preset and parameters (its factory is a
    pure function of them, and every later change of a spec is a copy), a copy of it each time."""
    factory = get_preset_factory(name)
    try:
        key = json.dumps(params)  # (in the request's order: a factory sees its parameters as they came)
    except TypeError:  # parameters that are not JSON (an in-process caller's): made as they are
        return call_preset(name, factory, params)
    return _made_preset(name, factory, key).model_copy()


@functools.lru_cache(maxsize=128)
def _made_preset(name: str, factory: Callable[..., ProtocolSpec], params: str) -> ProtocolSpec:
    return call_preset(name, factory, json.loads(params))


def build_spec(protocol: str | dict[str, Any], options: DebateOptions, settings: ServerSettings) -> ProtocolSpec:
    limits = settings.limits
    if isinstance(protocol, str):
        if protocol not in preset_names():
            hint = _parameters_hint(protocol)
            if hint is not None:
                raise RequestError(f"protocol: {hint}", param="protocol")
            shown = protocol if len(protocol) <= 120 else protocol[:119] + "…"
            close = closest_preset(protocol[:200])
            meant = f" (did you mean {close!r}?)" if close is not None else ""
            raise RequestError(
                f"protocol: no preset named {shown!r}{meant}; use one of {', '.join(preset_names())}, or give an "
                "inline spec (an object in the form of a protocol YAML file)",
                param="protocol",
            )
        _check_sizes(options.with_, "with", settings)
        try:
            spec = _preset(protocol, options.with_)
        except TypeError as exc:
            raise RequestError(f"with: {exc}; see GET /v1/protocols for the presets", param="with") from None
        except (SpecError, ValidationError, ValueError, KeyError) as exc:
            raise RequestError(f"with: {_first_line(exc)}", param="with") from None
        explicit = False
    else:
        if options.with_:
            raise RequestError(
                "with: applies to a preset name; in an inline spec write {'preset': NAME, 'with': {...}}",
                param="with",
            )
        _check_sizes(protocol, "protocol", settings)
        _check_stop(protocol)
        try:
            spec, _ = load_protocol_data(protocol, Path("protocol"))
        except ProtocolFileError as exc:
            raise RequestError(str(exc), param="protocol") from None
        except (SpecError, ValueError) as exc:
            raise RequestError(f"protocol: {_first_line(exc)}", param="protocol") from None
        explicit = True

    if options.rounds is not None:
        if options.rounds > limits.max_rounds:
            raise RequestError(
                f"rounds: {options.rounds} is over this server's limit of {limits.max_rounds}; ask for fewer",
                param="rounds",
            )
        spec = spec.model_copy(update={"rounds": options.rounds})
    elif spec.rounds > limits.max_rounds:
        if explicit:
            raise RequestError(
                f"protocol.rounds: {spec.rounds} is over this server's limit of {limits.max_rounds}; ask for fewer",
                param="protocol.rounds",
            )
        spec = spec.model_copy(update={"rounds": limits.max_rounds})
    if len(spec.participants) > limits.max_participants:
        raise RequestError(
            f"protocol: {len(spec.participants)} participants is over this server's limit of "
            f"{limits.max_participants}; use fewer agents",
            param="with.agents" if not explicit else "protocol.participants",
        )
    return _capped(spec, options, settings, explicit)


def _capped(spec: ProtocolSpec, options: DebateOptions, settings: ServerSettings, explicit: bool) -> ProtocolSpec:
    """Budgets within the server's limits: a value the request states over a limit is refused, a
    protocol's own default over a limit is lowered to it, an open budget gets the limit."""
    limits = settings.limits
    caps: dict[str, float] = {
        "max_tokens_per_turn": limits.max_tokens_per_turn,
        "max_calls": limits.max_calls,
        "max_total_tokens": limits.max_total_tokens,
        "timeout_s": limits.timeout_s,
    }
    asked = options.budget.model_dump(exclude_none=True)
    budget = spec.budget.model_dump()
    for key, cap in caps.items():
        if key in asked:
            if asked[key] > cap:
                raise RequestError(
                    f"budget.{key}: {asked[key]:g} is over this server's limit of {cap:g}; ask for at most that",
                    param=f"budget.{key}",
                )
            budget[key] = asked[key]
        elif budget[key] is not None and budget[key] > cap:
            if explicit:
                raise RequestError(
                    f"protocol.budget.{key}: {budget[key]:g} is over this server's limit of {cap:g}; "
                    "ask for at most that",
                    param=f"protocol.budget.{key}",
                )
            budget[key] = cap
        elif budget[key] is None:  # the timeout: every front door's default (moot.core.budget), within the cap
            budget[key] = min(cap, default_timeout_s(spec)) if key == "timeout_s" else cap
    budget["max_calls"] = int(budget["max_calls"])
    budget["max_total_tokens"] = int(budget["max_total_tokens"])
    budget["max_tokens_per_turn"] = int(budget["max_tokens_per_turn"])
    tokens_cap = limits.max_tokens_per_turn
    participants = []
    for p in spec.participants:
        if p.max_tokens is not None and p.max_tokens > tokens_cap:
            if explicit:
                raise RequestError(
                    f"protocol.participants.{p.id}.max_tokens: {p.max_tokens} is over this server's limit of "
                    f"{tokens_cap}; ask for at most that",
                    param=f"protocol.participants.{p.id}.max_tokens",
                )
            p = p.model_copy(update={"max_tokens": tokens_cap})
        participants.append(p)
    decision = spec.decision
    if isinstance(decision, SynthesizeDecision | JudgeDecision) and decision.max_tokens > tokens_cap:
        if explicit and "max_tokens" in decision.model_fields_set:
            raise RequestError(
                f"protocol.decision.max_tokens: {decision.max_tokens} is over this server's limit of {tokens_cap}; "
                "ask for at most that",
                param="protocol.decision.max_tokens",
            )
        decision = decision.model_copy(update={"max_tokens": tokens_cap})
    capped = spec.model_copy(
        update={
            "budget": spec.budget.model_validate(budget),
            "participants": participants,
            "decision": decision,
        }
    )
    # A request's own turn limit bounds every turn, a synthesis's or a judge's too, as the CLI's
    # --max-tokens does (it bounded only the agents, and a synthesis ran to its own 800 tokens).
    turn = asked.get("max_tokens_per_turn")
    return capped.with_turn_tokens(int(turn)) if turn is not None else capped


def judge_of(request: QualityRequest | None, settings: ServerSettings) -> BaseChatModel | None:
    """The judge model of a quality request (one of the server's models), or None."""
    if request is None or request.judge_model is None:
        return None
    name = request.judge_model
    check_model(name, "quality.judge_model", settings)
    try:
        return resolve_model(name, **(settings.model_options() if name.startswith("openai:") else {}))
    except ModelConfigError as exc:
        raise RequestError(f"the server cannot use its model: {exc}", status=503, code="model_unavailable") from None


def prepare(
    protocol: str | dict[str, Any],
    question: str,
    context: list[ContextChunk],
    options: DebateOptions,
    settings: ServerSettings,
    *,
    reference: str | None = None,
    adjust: Callable[[ProtocolSpec], ProtocolSpec] | None = None,
    schemas: Mapping[str, type[BaseModel]] | None = None,
    conversation: bool = False,
    truncate: bool = True,
    images: Sequence[ImageInput] = (),
) -> Prepared:
    """The spec, task and engine of a request, or a :class:`RequestError`. ``images``: shown with the question, to
    debaters and a decision whose models read images (else refused, as ``images``). ``adjust``: what the request
    changes in the protocol besides the debate options (the OpenAI endpoints' sampling and reply fields), before the
    checks every protocol gets. ``conversation``: the context is a conversation's earlier messages (the OpenAI
    endpoints), which every debater reads, the oldest left out when they do not fit the prompt budget
    (:func:`fit_conversation`), rather than passages of which the protocol reads its first few and a request may
    give at most ``max_context_passages`` (``truncate`` False: a conversation that does not fit is refused whole).
    ``schemas``: the turn schemas of the request's own that the adjusted spec names (its tools', its reply's), given
    to its engine as values (read once ``adjust`` has run: it may add to them)."""
    limits = settings.limits
    if len(question) > limits.max_question_chars:
        raise RequestError(
            f"question: {len(question)} characters is over this server's limit of {limits.max_question_chars}; "
            "shorten it, give the material as context (on the OpenAI routes: in an earlier message), or start "
            "the server with a larger --max-question-chars",
            param="question",
        )
    if len(context) > limits.max_context_passages and not conversation:
        raise RequestError(
            f"context: {len(context)} passages is over this server's limit of {limits.max_context_passages}; "
            "give fewer",
            param="context",
        )
    spec = build_spec(protocol, options, settings)
    if adjust is not None:
        spec = adjust(spec)
    if conversation:
        spec = spec.model_copy(update={"max_context_chunks": None})
    model = options.model or settings.default_model
    if options.model is not None:
        check_model(options.model, "model", settings)
        _check_tuned_model(protocol, options.model, settings, "model")
    for key, value in options.models.items():
        check_model(value, f"models.{key}", settings)
        _check_tuned_model(protocol, value, settings, f"models.{key}")
    for p in spec.participants:
        if p.model is not None:
            check_model(p.model, f"protocol.participants.{p.id}.model", settings)
    decision_model = getattr(spec.decision, "model", None)
    if decision_model is not None:
        check_model(decision_model, "protocol.decision.model", settings)
    check_sampling(spec, protocol, options)
    check_call_budget(spec, protocol, options, settings)
    task = DebateTask(question=question, context=context, reference=reference, images=list(images))
    try:
        engine = Engine(spec, model, models=dict(options.models), schemas=schemas, **settings.model_options())
    except KeyError as exc:
        routable = sorted({p.id for p in spec.participants} | {p.persona.role for p in spec.participants} - {""})
        raise RequestError(
            f"models: {exc.args[0]}; use participant ids or roles: {', '.join(routable)}, or 'decision'",
            param="models",
        ) from None
    except ModelConfigError as exc:
        raise RequestError(f"the server cannot use its model: {exc}", status=503, code="model_unavailable") from None
    if not settings.image_urls and any(not i.url.startswith("data:") for i in task.images):
        raise RequestError(
            "images: this server takes images sent inline only (a data:image/...;base64 URL): an address would be "
            "fetched by the model's server, from its own network; send the image's bytes, or start the server with "
            "--image-urls",
            param="images",
        )
    if (problem := image_problem(spec, task, engine.models, engine.decision_model)) is not None:
        raise RequestError(f"images: {problem}", param="images")
    if conversation and truncate:
        task = fit_conversation(spec, task, engine)
    if (problem := input_problem(spec, task, engine.models, engine.decision_model)) is not None:
        where = "context" if task.context else "question"  # what no budget can hold: the CLI's rule too
        raise RequestError(f"{where}: {problem}", param=where)
    return Prepared(spec=spec, task=task, engine=engine, model=model)


def _check_tuned_model(protocol: str | dict[str, Any], model: str, settings: ServerSettings, param: str) -> None:
    """The tuned protocol (``auto``) runs on the model it was tuned on, as the server's start checks
    for its default model: its evidence (accuracy, cost, the vote it beat) holds for that model only."""
    tuned = settings.tuned
    if tuned is None or not isinstance(protocol, dict) or protocol != tuned.spec_data():
        return
    from moot.models.registry import canonical_spec

    tuned_on = canonical_spec(tuned.evidence.model)
    if canonical_spec(model) != tuned_on:
        raise RequestError(
            f"{param}: the tuned protocol was tuned on {tuned_on}, and its evidence holds for that model only; "
            f"leave {param} out (the server's default is that model) or name another protocol",
            param=param,
        )


#: The context passages of a conversation that are its caller's instructions: never left out.
INSTRUCTING = frozenset({"system", "developer", "instructions"})
#: The source of the passage that records how many earlier messages were left out.
LEFT_OUT = "moot"
#: The extra field that marks a passage as a file the question sends (:func:`attached`).
ATTACHED = "attached"


def attached(chunk: ContextChunk) -> bool:
    """Whether a passage is a file the question itself sends (:mod:`moot.server.openai.input_files`): never
    left out as an earlier message is, since the question asks about it; too long, it is refused."""
    return bool((chunk.model_extra or {}).get(ATTACHED))


def attach(chunk: ContextChunk) -> ContextChunk:
    """``chunk``, a file the question sends, marked so (:func:`attached`)."""
    return ContextChunk.model_validate({**chunk.model_dump(), ATTACHED: True})


def fit_conversation(spec: ProtocolSpec, task: DebateTask, engine: Engine) -> DebateTask:
    """The task with the oldest messages of its conversation left out until every prompt of the
    debate fits its budget (:func:`~moot.core.budget.input_problem`: the models' context windows,
    ``budget.max_prompt_tokens``, ``budget.max_total_tokens``), as the engine leaves out the oldest
    history of a debate. The caller's instructions stay; a passage where the cut is says how many
    messages were left out (``left_out``), so the transcript records it and the debaters know; a
    file the question sends (:func:`attached`) stays with the question. The
    task as it is when it fits, or when nothing left out would make it fit (then refused as before)."""
    models, decision_model = engine.models, engine.decision_model
    if input_problem(spec, task, models, decision_model) is None:
        return task
    dropped = [i for i, c in enumerate(task.context) if c.source not in INSTRUCTING and not attached(c)]

    def without(n: int) -> DebateTask:
        gone = set(dropped[:n])
        kept = [c for i, c in enumerate(task.context) if i not in gone]
        if n:
            at = next((i for i, c in enumerate(kept) if c.source not in INSTRUCTING), len(kept))
            note = ContextChunk.model_validate(
                {
                    "text": f"({n} earlier message{'s' if n != 1 else ''} of this conversation, the oldest, "
                    "were left out to fit the prompt budget)",
                    "source": LEFT_OUT,
                    "left_out": n,
                }
            )
            kept.insert(at, note)
        return task.model_copy(update={"context": kept})

    low, high = 1, len(dropped)  # the fewest left out that fits: input_problem only shrinks as more go
    if input_problem(spec, without(high), models, decision_model) is not None:
        return task
    while low < high:
        mid = (low + high) // 2
        if input_problem(spec, without(mid), models, decision_model) is None:
            high = mid
        else:
            low = mid + 1
    return without(low)


def check_call_budget(
    spec: ProtocolSpec, protocol: str | dict[str, Any], options: DebateOptions, settings: ServerSettings
) -> None:
    """The CLI's pre-flight check (:meth:`ProtocolSpec.call_budget_problem`): a call budget that cannot
    fit one round and the decision could only fail, so it is refused before the debate is queued,
    naming the field that set it."""
    problem = spec.call_budget_problem()
    if problem is None:
        return
    if options.budget.max_calls is not None:
        field = "budget.max_calls"
    elif isinstance(protocol, dict) and isinstance(protocol.get("budget"), dict) and "max_calls" in protocol["budget"]:
        field = "protocol.budget.max_calls"
    else:
        # The server's own limit lowered the protocol's budget: the protocol is too large for this server.
        need = spec.round_calls() + spec.decision_calls
        raise RequestError(
            f"protocol: {spec.name} needs at least {need} calls (one round of {spec.round_calls()} and the "
            f"decision's {spec.decision_calls}), over this server's limit of {settings.limits.max_calls} calls per "
            "debate (its --max-calls); use fewer participants",
            param="protocol",
        )
    raise RequestError(f"{field}: {problem}", param=field)


def check_sampling(spec: ProtocolSpec, protocol: str | dict[str, Any], options: DebateOptions) -> None:
    """Every participant's temperature and seed within what the backends take (a preset's come from
    its ``with`` parameters, an inline spec's are its own fields)."""
    preset = isinstance(protocol, str)

    def where(participant: str | None, key: str) -> str:
        if preset:
            given = [k for k in options.with_ if k == key or (key == "seed" and k.endswith("seed"))]
            return f"with.{given[0]}" if given else "with"
        return f"protocol.participants.{participant}.{key}" if participant else f"protocol.{key}"

    values: list[tuple[str | None, str, float | None]] = [(None, "temperature", spec.temperature)]
    for p in spec.participants:
        values += [(p.id, "temperature", p.temperature), (p.id, "seed", p.seed)]
    for participant, key, value in values:
        if value is None:
            continue
        lo, hi = TEMPERATURE_RANGE if key == "temperature" else SEED_RANGE
        if not lo <= value <= hi:
            field = where(participant, key)
            whose = f" (participant {participant})" if participant and preset else ""
            raise RequestError(
                f"{field}: {key} {_shown(value)}{whose} is out of range; give {_shown(lo)} to {_shown(hi)}",
                param=field,
            )


def _shown(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        first = first_error(exc)
        where = ".".join(str(x) for x in first["loc"]) or "value"
        return f"{where}: {first['msg']}"
    text = str(exc.args[0]) if exc.args else str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
