"""Model spec strings, resolved in one place.

=========================  =====================================================================
``embedded``               the best embedded model that is installed
``embedded:NAME``          ``smollm2-135m``, ``qwen2.5-0.5b``, ``qwen2.5-1.5b`` (llama.cpp)
``openai:MODEL``           any OpenAI-compatible endpoint (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``)
``scripted:FILE``          replies read in order from a JSON/YAML list (dry runs, tests)
``langchain:MODULE:ATTR``  a LangChain chat model (or a function returning one) by import path
                           (``moot[langchain]``)
=========================  =====================================================================

A LangChain chat model object is accepted wherever a spec is (see
:mod:`moot.models.langchain`): it is wrapped once per object, so the agents given the same
object share one model and one concurrency limit. LangChain is imported only for ``langchain:``
specs and for objects whose class comes from an already-imported ``langchain_core``.

Every model is checked when it is resolved, before any call, so that each front door (``moot
debate``, ``moot run``, ``moot batch``, ``moot serve``, :class:`~moot.core.engine.Engine`, which
resolves every participant's, the decision's and the ``models=`` routing's model when it is made)
refuses one that cannot run: an unknown spec, a missing scripted file, an ``openai:`` model without
a key, an ``embedded:`` model whose weights are not installed.

``MOOT_MODEL`` sets the default spec. Resolved models are cached per process, so every agent
that names the same spec shares one model, one concurrency limit and (embedded) one llama.cpp
server.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from typing import Any

from moot.models.base import BaseChatModel, ModelConfigError, ModelSpecError

DEFAULT_SPEC = "embedded"
logger = logging.getLogger("moot.models")
_cache: dict[tuple[str, tuple[tuple[str, Any], ...]], BaseChatModel] = {}
#: Held while a model is built for the cache (two threads would build two of one spec).
_building = threading.RLock()
# Wrapped model objects (LangChain chat models) by id; the entry keeps the object alive, so an id
# is never reused while it is here.
_wrapped: dict[int, tuple[object, BaseChatModel]] = {}


def default_spec() -> str:
    return os.environ.get("MOOT_MODEL") or DEFAULT_SPEC


def canonical_spec(spec: str) -> str:
    """The model a spec names, written out: ``embedded`` is the best embedded model installed
    (``embedded:qwen2.5-1.5b``); any other spec is itself."""
    spec = spec.strip()
    if spec == "embedded":
        from moot.models.embedded import best_installed

        best = best_installed()
        return f"embedded:{best.name}" if best is not None else spec
    return spec


#: The options an ``openai:`` spec's backend takes (:class:`~moot.models.openai_compat.OpenAICompatModel`'s
#: keywords), named here so that a caller's other keywords are refused without importing it.
OPENAI_OPTIONS = frozenset({"base_url", "api_key", "timeout_s", "max_concurrency", "retry"})


def resolve_model(spec: str | BaseChatModel | object | None = None, **options: Any) -> BaseChatModel:
    """Turn a spec string into a model (a model passes through unchanged; a LangChain chat model is
    wrapped, once per object).

    ``options`` go to the backend of a spec string: for ``openai:`` ``base_url``, ``api_key``,
    ``timeout_s``, ``max_concurrency``; for ``langchain:`` ``max_concurrency``, ``timeout_s``.
    Nothing is loaded or called here. A spec that cannot be used (unknown, no model name, a missing
    scripted file, no API key) raises :class:`ModelSpecError`: it is bad input, found before any call.
    """
    if isinstance(spec, BaseChatModel):
        return spec
    if spec is not None and not isinstance(spec, str):
        return _wrap(spec)
    from_env = not spec and bool(os.environ.get("MOOT_MODEL"))
    spec = (spec or default_spec()).strip()
    options = {k: v for k, v in options.items() if v is not None}
    key = (spec, tuple(sorted(options.items())))
    cached = _cache.get(key)
    if cached is not None:
        return cached
    with _building:  # one model a spec, built once: debates are built in several threads (a review)
        cached = _cache.get(key)
        if cached is not None:
            return cached
        return _built(key, spec, options, from_env)


def _built(
    key: tuple[str, tuple[tuple[str, Any], ...]], spec: str, options: dict[str, Any], from_env: bool
) -> BaseChatModel:
    """:func:`resolve_model`'s build of a spec string not in the cache, then cached."""
    # A spec the user never typed is named by where it came from: the environment's MOOT_MODEL.
    told = "MOOT_MODEL (the default model): " if from_env else ""
    try:
        model = _build(spec, options)
    except ModelSpecError as exc:
        if not told:
            raise
        raise ModelSpecError(told + str(exc), status=exc.status) from None
    except ModelConfigError as exc:
        raise ModelSpecError(told + str(exc), status=exc.status) from None
    _cache[key] = model
    return model


def _build(spec: str, options: dict[str, Any]) -> BaseChatModel:
    kind, _, arg = spec.partition(":")
    if kind == "embedded":
        from moot.models.embedded import EmbeddedModel, best_installed
        from moot.models.weights import CATALOG

        _reject_options(spec, options)
        if not arg:
            best = best_installed()
            if best is None:
                raise ModelConfigError(
                    "no embedded model is installed. Install one with: moot models install qwen2.5-1.5b "
                    f"(known: {', '.join(CATALOG)}), or use --model openai:MODEL"
                )
            arg = best.name
            logger.info("model: embedded:%s (the best embedded model installed; pass a model or set MOOT_MODEL)", arg)
        model = EmbeddedModel(arg)
        _check_embedded(model)
        return model
    if kind == "openai":
        from moot.models.openai_compat import OpenAICompatModel

        return OpenAICompatModel(arg, **options)
    if kind == "scripted":
        from moot.models.scripted import load_script

        _reject_options(spec, options)
        return load_script(arg)
    if kind == "langchain":
        from moot.models.langchain import load_spec

        return load_spec(arg, **options)
    hint = f" (did you mean {_close_spec(spec)}?)" if not arg and spec else ""
    raise ModelSpecError(
        f"unknown model spec {spec!r}{hint}: use embedded, embedded:NAME, openai:MODEL, scripted:FILE "
        "or langchain:MODULE:ATTR"
    )


def _close_spec(spec: str) -> str:
    """What a spec with no kind was most likely meant to be: a misspelt kind (``embeded``: embedded),
    else an OpenAI-compatible model of that name."""
    import difflib

    from moot.models.weights import CATALOG

    meant = {
        "embedded": "embedded",
        **{n: f"embedded:{n}" for n in CATALOG},
        **{f"embedded:{n}": f"embedded:{n}" for n in CATALOG},
    }
    close = difflib.get_close_matches(spec, list(meant), n=1, cutoff=0.8)
    return meant[close[0]] if close else f"openai:{spec}"


def _check_embedded(model: Any) -> None:
    """An embedded model that cannot answer its first call (weights not installed, llama.cpp's
    engine missing) is refused now, as bad input naming the fix, not met at every call of the
    debate (which then went on with the agents that could run). Nothing is read or loaded: the
    weights' hash is checked when they are loaded."""
    from moot.models.weights import install_command, is_installed

    if not is_installed(model.info):
        raise ModelSpecError(
            f"{model.name} is not installed. Install its weights with: {install_command(model.info)}, "
            "or name another model (moot models lists them)"
        )
    if importlib.util.find_spec("xllamacpp") is None:
        raise ModelSpecError(
            f"{model.name} needs the embedded engine, which is not installed: pip install 'moot[embedded]'"
        )


def _wrap(obj: object) -> BaseChatModel:
    """A moot model for a LangChain chat model object (the same one each time for one object)."""
    cached = _wrapped.get(id(obj))
    if cached is not None:
        return cached[1]
    # An object can only be a LangChain model if langchain_core is already imported.
    if "langchain_core" not in sys.modules:
        raise ModelConfigError(
            f"a {type(obj).__name__} is not a model: give a spec string, a moot BaseChatModel or a LangChain chat model"
        )
    from moot.models.langchain import as_moot_model

    model = as_moot_model(obj)
    _wrapped[id(obj)] = (obj, model)
    return model


def _reject_options(spec: str, options: dict[str, Any]) -> None:
    if options:
        names = ", ".join(sorted(options))
        raise ModelConfigError(f"{names} only apply to openai: models, not to {spec!r}")


def clear_cache() -> None:
    """Forget resolved models (tests)."""
    _cache.clear()
    _wrapped.clear()
