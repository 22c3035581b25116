"""Any LangChain chat model as a moot model (``pip install 'moot[langchain]'``).

The backend lives in :mod:`moot.models.langchain` (one file per backend, below everything that uses
models); this module is its public name among the integrations, and what the docs import.
"""

from __future__ import annotations

from moot.models.langchain import LangChainModel, as_moot_model, cut_at_stop, load_spec

__all__ = ["LangChainModel", "as_moot_model", "cut_at_stop", "load_spec"]
