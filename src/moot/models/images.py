"""Images a message shows a model (:class:`ImageInput`): their form, where moot reads one; their
bytes, where a caller gives one (:func:`image_given_problem`); and the words a text-only model is
refused with (:func:`text_only`)."""

from __future__ import annotations

import base64
import itertools
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

#: The least a model charges for an image in a prompt (OpenAI's low detail: 85 tokens): what a
#: prompt's estimate counts for each (:func:`messages_tokens`), so that what is refused does not fit.
IMAGE_TOKENS = 85
#: The most images one debate shows (as OpenAI's chat completions, which take many, a debate sends
#: each to every agent in every prompt: a bound on what one request can multiply).
MAX_IMAGES = 10
#: The images a model may be sent: a web address (the model's server fetches it; moot never reads
#: it) or the image itself, inline, as a base64 data URL of one of these types.
IMAGE_TYPES = ("png", "jpeg", "gif", "webp")
_DATA_URL = re.compile(r"data:image/(?:" + "|".join((*IMAGE_TYPES, "jpg")) + r");base64,[A-Za-z0-9+/=\s]+")


def image_kind(head: bytes) -> str | None:
    """The image type (one of :data:`IMAGE_TYPES`) whose first bytes ``head`` are (12 are enough), or None."""
    for magic, kind in (
        (b"\x89PNG\r\n\x1a\n", "png"),
        (b"\xff\xd8\xff", "jpeg"),
        (b"GIF87a", "gif"),
        (b"GIF89a", "gif"),
    ):
        if head.startswith(magic):
            return kind
    return "webp" if head[:4] == b"RIFF" and head[8:12] == b"WEBP" else None


def image_given_problem(url: str) -> str | None:
    """Why an image a caller gives now cannot be sent (None if it can), beyond its form, which
    :class:`ImageInput` checks wherever one is read (a stored transcript too): an inline image's
    first bytes are no image (a model's server would refuse it after the debate's other calls were
    paid for), or an address holds ``***`` (what looked like a key in it was redacted where it was
    stored: sent on, it is a broken address). Checked where an image comes in: the doors, and
    :func:`moot.core.budget.image_problem`."""
    if not url.startswith("data:"):
        if "***" in url:
            return (
                "the address holds *** (what looked like a key in it was redacted where it was stored); send the "
                "image again, inline or by its address"
            )
        return None
    start = url.find(";base64,") + len(";base64,")
    head = "".join(itertools.islice((url[k] for k in range(start, len(url)) if not url[k].isspace()), 16))
    try:
        kind = image_kind(base64.b64decode(head + "=" * (-len(head) % 4)))
    except ValueError:
        kind = None
    if kind is None:
        return f"the data holds no {', '.join(IMAGE_TYPES)} image; give the image's own bytes"
    return None


class ImageInput(BaseModel):
    """An image a message shows the model: ``url`` is ``https://`` or ``http://`` (fetched by the
    model's server, never by moot) or a ``data:image/...;base64,`` URL; ``detail`` as OpenAI's
    (``low``, ``high``, ``auto``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    detail: Literal["auto", "low", "high"] = "auto"

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if v.startswith(("https://", "http://")) and len(v) > len("https://") and not any(c.isspace() for c in v):
            return v
        if v.startswith("data:"):
            if _DATA_URL.fullmatch(v) is None:
                raise ValueError(
                    f"an inline image is a base64 data URL of a {', '.join(IMAGE_TYPES)} image "
                    "(data:image/png;base64,...); give it so, or the image's https address"
                )
            return v.replace("data:image/jpg;", "data:image/jpeg;", 1)  # (many clients write jpg)
        raise ValueError(
            f"{v[:40]!r} is neither an https:// address nor a data:image/...;base64 URL; give the image as one of these"
        )


def text_only(name: str, images: int) -> str:
    """Why a text-only model is not sent ``images`` images, and what to do."""
    return (
        f"{name} reads text only, and {images} image{'s' if images != 1 else ''} would be shown to it: give a "
        "model that reads images (openai:MODEL of a vision model, on any OpenAI-compatible server), or leave the "
        "images out"
    )
