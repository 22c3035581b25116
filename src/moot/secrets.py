"""Keep secrets out of logs, transcripts and error messages."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

# Environment variables whose values are secrets wherever they turn up.
SECRET_ENV_VARS = ("OPENAI_API_KEY", "MOOT_API_KEY", "OPENROUTER_API_KEY", "ANTHROPIC_API_KEY")

# Shapes of common API keys, redacted even when we did not know the value.
_KEY_SHAPES = re.compile(r"\b(sk-[A-Za-z0-9_\-]{12,}|Bearer\s+[A-Za-z0-9_\-\.]{12,})")


def known_secrets() -> list[str]:
    return [v for name in SECRET_ENV_VARS if (v := os.environ.get(name)) and len(v) >= 6]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Replace every known secret (given ones and those in the environment) by ``***``."""
    for secret in [*secrets, *known_secrets()]:
        if secret and len(secret) >= 6:
            text = text.replace(secret, "***")
    return _KEY_SHAPES.sub("***", text)
