"""Prices of models, per million tokens, from the user: moot ships none.

A price list for providers would be out of date the day it shipped, so moot invents none: prices
come from a file (YAML or JSON, ``--prices FILE`` or ``$MOOT_PRICES``) or from options
(``--price openai:gpt-4o-mini=0.15,0.60``), in US dollars per million prompt (input) and
completion (output) tokens, and optionally prompt tokens the provider served from its prompt cache
(``cached_input``, the third value of ``--price``; without it they cost ``input``)::

    openai:gpt-4o-mini: {input: 0.15, output: 0.60, cached_input: 0.075}
    openai:gpt-4o: {input: 2.50, output: 10.00}

Embedded models run on the user's own machine and cost 0 (a file may still price them). A model
with no price has no cost: it is shown in tokens only, and says so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moot.files import InputFileError, first_error, load_json, load_yaml, read_text, syntax_problem, too_deep

#: The environment variable naming a default price file.
PRICES_ENV = "MOOT_PRICES"


class PriceError(ValueError):
    """A price file or option cannot be read: the message names the problem and the fix."""


class Price(BaseModel):
    """What a model costs, in US dollars per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, allow_inf_nan=False, description="USD per million prompt tokens")
    output: float = Field(ge=0, allow_inf_nan=False, description="USD per million completion tokens")
    cached_input: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="USD per million prompt tokens the provider read from its prompt cache (default: input)",
    )

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> float:
        """USD for these tokens; ``cached_prompt_tokens`` (part of ``prompt_tokens``) at ``cached_input``."""
        cached = min(cached_prompt_tokens, prompt_tokens) if self.cached_input is not None else 0
        fresh = prompt_tokens - cached
        return (fresh * self.input + cached * (self.cached_input or 0.0) + completion_tokens * self.output) / 1_000_000


FREE = Price(input=0.0, output=0.0)


class PriceTable(BaseModel):
    """Model spec -> price. A key matches a model's spec exactly (``openai:gpt-4o-mini``), or its
    name without the backend (``gpt-4o-mini``)."""

    model_config = ConfigDict(extra="forbid")

    prices: dict[str, Price] = Field(default_factory=dict)

    def price_for(self, model: str) -> Price | None:
        """The model's price; embedded models cost 0 unless priced; None when there is no price."""
        if model in self.prices:
            return self.prices[model]
        _, _, bare = model.partition(":")
        if bare and bare in self.prices:
            return self.prices[bare]
        if model == "embedded" or model.startswith("embedded:"):
            return FREE
        return None

    def merged(self, other: PriceTable) -> PriceTable:
        """This table with ``other``'s prices on top."""
        return PriceTable(prices={**self.prices, **other.prices})


def load_prices(path: str | Path) -> PriceTable:
    """A price file: a YAML or JSON mapping of model spec to ``{input, output}`` (USD per million tokens)."""
    p = Path(path)
    mapping = (
        "a YAML/JSON mapping like  openai:gpt-4o-mini: {input: 0.15, output: 0.60, cached_input: 0.075}  "
        "(USD per million tokens; cached_input is optional)"
    )
    hint = f"give {mapping}"
    try:
        text = read_text(p, "price file")  # UTF-8, a BOM read (JSON too); a folder or missing file named
        data: Any = load_json(text) if p.suffix == ".json" else load_yaml(text)
    except InputFileError as exc:
        raise PriceError(f"{exc}; {hint}") from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        if (deep := too_deep(exc)) is not None:  # (valid, but past what moot reads: no position to name)
            raise PriceError(f"price file {str(p)!r} is refused: {deep} to {mapping}") from None
        kind = "JSON" if p.suffix == ".json" else "YAML"
        raise PriceError(f"price file {str(p)!r} is not valid {kind} ({syntax_problem(exc)}); {hint}") from None
    if not isinstance(data, dict) or not data:
        held = "" if isinstance(data, dict) or data is None else f" (a {_kind(data)}, not a mapping)"
        raise PriceError(f"price file {str(p)!r} holds no prices{held}; {hint}")
    try:
        return PriceTable.model_validate({"prices": data})
    except ValidationError as exc:
        first = first_error(exc)
        where = ".".join(str(x) for x in first["loc"][1:])
        raise PriceError(f"price file {str(p)!r}: invalid {where}: {first['msg']}; {hint}") from None


def _kind(value: Any) -> str:
    """What a file that is not a mapping holds, in words."""
    kinds = {bool: "true/false value", int: "number", float: "number", str: "string", list: "list"}
    return kinds.get(type(value), type(value).__name__)


def parse_price(option: str) -> tuple[str, Price]:
    """``SPEC=INPUT,OUTPUT[,CACHED_INPUT]`` (USD per million tokens), as given to ``--price``."""
    spec, sep, values = option.partition("=")
    parts = [v.strip() for v in values.split(",")]
    try:
        if not sep or not spec.strip() or len(parts) not in (2, 3):
            raise ValueError
        cached = float(parts[2]) if len(parts) == 3 else None
        return spec.strip(), Price(input=float(parts[0]), output=float(parts[1]), cached_input=cached)
    except (ValueError, ValidationError):
        raise PriceError(
            f"--price {option!r}: give MODEL=INPUT,OUTPUT[,CACHED_INPUT] in USD per million tokens, "
            "e.g. --price openai:gpt-4o-mini=0.15,0.60,0.075"
        ) from None


def price_table(path: str | Path | None = None, options: list[str] | None = None) -> PriceTable:
    """The prices a command uses: the file (``path``, else ``$MOOT_PRICES`` if set), then ``options``
    on top. Without either, an empty table: embedded models cost 0, the others show tokens only."""
    source = path if path is not None else os.environ.get(PRICES_ENV) or None
    table = load_prices(source) if source is not None else PriceTable()
    given = dict(parse_price(o) for o in options or [])
    return table.merged(PriceTable(prices=given)) if given else table
