"""Bridges to other frameworks, each an optional extra.

- :mod:`moot.integrations.langchain`: any LangChain chat model as a moot model
  (``pip install 'moot[langchain]'``); the backend itself is :mod:`moot.models.langchain`, one file
  per backend like the others, so that ``models/`` imports nothing above it.
- :mod:`moot.integrations.langgraph`: a protocol as a LangGraph subgraph of the engine's steps, and
  seed 003's arbitration as a workflow node (``pip install 'moot[langgraph]'``).

No framework is imported here: ``import moot`` and the core never need LangChain or LangGraph, and a
submodule whose framework is missing fails at import with a one-line message naming the extra.
"""

from __future__ import annotations

from moot.models.base import MissingExtra

__all__ = ["MissingExtra"]
