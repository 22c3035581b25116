"""The debate models the OpenAI door offers: ``moot/<protocol>`` (``:trace`` streams its turns as
reasoning), the tuned protocol (``moot/auto`` and its label), and their cards (``GET /v1/models``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moot.core.spec import (
    JudgeDecision,
    ProtocolSpec,
    SynthesizeDecision,
    VoteDecision,
)
from moot.protocols import closest_preset, get_preset, get_preset_factory, preset_names
from moot.server.limits import RequestError
from moot.server.policy import build_spec, check_call_budget
from moot.server.schemas import DebateOptions, ModelCard
from moot.server.settings import ServerSettings
from moot.server.tuned import AUTO, TunedModel

PREFIX = "moot/"
#: The model-name variant that streams the debate's turns as reasoning.
TRACE = ":trace"

# ------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class DebateModel:
    """What a ``model`` field names: a protocol (a preset's name, or a tuned protocol's inline spec),
    and whether the debate's turns stream too."""

    protocol: str | dict[str, Any]
    trace: bool = False


def asks_trace(model: str) -> bool:
    """Whether a model name asks for the debate's turns (``moot/<protocol>:trace``)."""
    return model.startswith(PREFIX) and model.endswith(TRACE)


def tuned_names(tuned: TunedModel) -> tuple[str, ...]:
    """The names the tuned protocol answers to: ``auto``, and its label unless a built-in protocol has
    that name (``single``, ``vote@3``), which keeps naming the built-in: loading a tune never changes
    what an existing model name does, and no name is listed twice."""
    return (AUTO,) if tuned.label in preset_names() else (AUTO, tuned.label)


def debate_model(model: str, where: str = "model", tuned: TunedModel | None = None) -> DebateModel:
    """``moot/<protocol>`` or ``moot/<protocol>:trace`` (``moot/auto`` and ``moot/<label>``: the tuned
    protocol the server was started with), else a 404 listing what is offered."""
    name = model.removeprefix(PREFIX) if model.startswith(PREFIX) else None
    trace = asks_trace(model)
    if name is not None and trace:
        name = name.removesuffix(TRACE)
    if tuned is not None and name in tuned_names(tuned):
        return DebateModel(tuned.spec_data(), trace)
    if name is not None and name in preset_names() and is_application(name):
        raise RequestError(
            f"{where}: {model!r} is an application's protocol, not a chat model: its turns answer that "
            f"application's own task, not a conversation's question; run it with POST /v1/debates (protocol "
            f"{name!r}), or use one of the chat models (GET /v1/models)",
            param=where,
            code="model_not_supported",
        )
    if name is None or name not in preset_names():
        chats = [n for n in preset_names() if not is_application(n)]
        offered = [PREFIX + n for n in (list(tuned_names(tuned)) if tuned is not None else []) + chats]
        hint = ""
        if name == AUTO:
            hint = "moot/auto is the protocol moot tune chose, served with moot serve --tuned tuned.yaml; "
        elif name is not None and (close := closest_preset(name[:200])) is not None and close in chats:
            hint = f"did you mean {PREFIX + close}? "
        raise RequestError(
            f"{where}: {model!r} is not offered here; {hint}use moot/<protocol> (or moot/<protocol>:trace for the "
            f"debate's turns as reasoning), one of: {', '.join(offered)} (GET /v1/models)",
            param=where,
            status=404,
            code="model_not_found",
        )
    return DebateModel(name, trace)


def accepts_tools(spec: ProtocolSpec) -> bool:
    """Whether a request to this protocol may send tools (:func:`~moot.core.tools.with_tools`): a
    vote decides over the agents' actions; a synthesis or a judge votes over them first, then writes
    the answer."""
    return isinstance(spec.decision, VoteDecision | SynthesizeDecision | JudgeDecision)


def accepts_typed_output(spec: ProtocolSpec) -> bool:
    """Whether a request to this protocol may ask for a typed reply: a synthesis or a judge writes it
    (:func:`~moot.server.openai.reply_format.typed_decision`), a vote's agents answer in it (with
    tools too: :meth:`~moot.server.openai.asked.Asked.adjust`)."""
    return isinstance(spec.decision, SynthesizeDecision | JudgeDecision | VoteDecision)


def is_application(name: str) -> bool:
    """Whether a preset is an application's (ABSA's, registered by ``moot.apps``): no chat model."""
    return get_preset_factory(name).__module__.startswith("moot.apps.")


def _card(name: str, spec: ProtocolSpec, description: str, **extra: Any) -> ModelCard:
    return ModelCard(
        id=PREFIX + name,
        description=description,
        protocol=spec.name if extra.get("tuned") is None else name,
        decision=spec.decision.kind,
        calls=spec.planned_calls(),
        accepts_tools=accepts_tools(spec),
        accepts_typed_output=accepts_typed_output(spec),
        **extra,
    )


def model_cards(tuned: TunedModel | None = None) -> tuple[list[ModelCard], list[ModelCard]]:
    """Every protocol as a model, with what it accepts and its calls a request (the tuned one first,
    as ``moot/auto`` and its label, with its evidence), then each again with ``:trace`` (its turns
    streamed as reasoning); and, apart, the applications' protocols (ABSA's), which are no chat models."""
    plain = []
    if tuned is not None:
        spec, evidence = tuned.spec(), tuned.evidence_json()
        plain += [_card(n, spec, tuned.summary(), tuned=evidence) for n in tuned_names(tuned)]
    apps = []
    for n in preset_names():
        spec = get_preset(n)
        if is_application(n):
            described = f"{spec.description or n} (an application's protocol, not a chat model)"
            apps.append(_card(n, spec, described, chat=False))
        else:
            plain.append(_card(n, spec, spec.description or n))
    traced = [
        card.model_copy(
            update={"id": card.id + TRACE, "description": f"{card.description} (the debate's turns as reasoning)"}
        )
        for card in plain
    ]
    return plain + traced, apps


def model_card(model: str, tuned: TunedModel | None = None) -> ModelCard:
    """The card of one model name (``GET /v1/models/{id}``), or the 404 an unknown name gets."""
    chat, apps = model_cards(tuned)
    for card in [*chat, *apps]:
        if card.id == model:
            return card
    debate_model(model, tuned=tuned)  # the 404 that lists what is offered
    raise RequestError(f"model: {model!r} is not offered here (GET /v1/models)", status=404, code="model_not_found")


def check_tuned(settings: ServerSettings) -> None:
    """Refuse, when the server starts, a tuned protocol its limits cannot run, or whose evidence was
    measured on another model than the one ``moot/auto`` would run on (a ``ValueError`` in one line)."""
    tuned = settings.tuned
    if tuned is None:
        return
    from moot.models.registry import canonical_spec

    tuned_on, serving = canonical_spec(tuned.evidence.model), canonical_spec(settings.default_model)
    if tuned_on != serving:
        raise ValueError(
            f"--tuned {tuned.path}: it was tuned on {tuned_on}, and moot/auto would run on this server's default "
            f"model, {serving}: its evidence holds for the model it was measured on; serve it with --models "
            f"{tuned_on} (first), or tune again on {serving}"
        )
    try:
        spec = build_spec(tuned.spec_data(), DebateOptions(), settings)
        check_call_budget(spec, tuned.spec_data(), DebateOptions(), settings)
    except RequestError as exc:
        raise ValueError(f"--tuned {tuned.path}: {exc.message}") from None
