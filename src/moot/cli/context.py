"""Context passages for ``moot debate --context``: read from files, checked, and refused in one line
that names the file, the passage and the fix."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moot.cli.common import UsageError
from moot.core.types import ContextChunk
from moot.files import check_text, first_error, load_json, read_text, text_lines
from moot.models.images import MAX_IMAGES, ImageInput, image_kind
from moot.protocols.loader import InputPassage, unknown_key_message


def load_context(paths: list[Path]) -> list[ContextChunk]:
    """Context passages from files: .json (a list of strings or {"text": ...} objects), .jsonl (one
    per line), any other file one passage, its text (.txt, .md, .csv...). Empty files and passages
    are refused."""
    chunks: list[ContextChunk] = []
    for path in paths:
        raw = read_text(path, "context file")
        if not raw.strip():
            raise UsageError(f"context file {str(path)!r} is empty; give it some text or leave it out")
        items: list[tuple[str, Any]]
        suffix = path.suffix.lower()
        if suffix == ".json":
            try:
                data = load_json(raw)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(data, list):
                raise UsageError(f"{path}: a .json context file must hold a list of passages")
            items = [(f"{path}: passage {k}", item) for k, item in enumerate(data, 1)]
        elif suffix == ".jsonl":
            items = []
            for n, line in enumerate(text_lines(raw), 1):
                if not line.strip():
                    continue
                try:
                    items.append((f"{path}:{n}", load_json(line)))
                except json.JSONDecodeError as exc:
                    raise UsageError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
        else:
            items = [(str(path), raw)]
        for where, item in items:
            check_text(item, where)
            if isinstance(item, str):
                item = {"text": item}
            if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                raise UsageError(f"{where}: every passage must be a string or an object with a 'text' string")
            if not item["text"].strip():
                raise UsageError(f"{where}: the passage is empty")
            try:  # text and source, as in every input file: an unknown key is refused by name
                chunks.append(InputPassage.model_validate({"source": path.name, **item}))
            except ValidationError as exc:
                first = first_error(exc)
                if first["type"] == "extra_forbidden":
                    raise UsageError(
                        f"{where}: {unknown_key_message(InputPassage, first['loc'], 'a passage')}"
                    ) from None
                raise UsageError(f"{where}: {' '.join(str(x) for x in first['loc'])}: {first['msg']}") from None
    return chunks


#: The most bytes one ``--image`` file may hold (a model's server takes about this much an image).
MAX_IMAGE_BYTES = 20 * 1024 * 1024


def load_images(given: list[str]) -> list[ImageInput]:
    """``moot debate --image``: each an image file (sent inline, as a base64 data URL) or an https
    address (the model's server fetches it; moot does not). Refused in one line that names it."""
    images: list[ImageInput] = []
    if len(given) > MAX_IMAGES:
        raise UsageError(f"--image: {len(given)} images, over the {MAX_IMAGES} a debate shows; give fewer")
    for item in given:
        if item.startswith(("https://", "http://")):
            try:
                images.append(ImageInput(url=item))
            except ValidationError as exc:
                raise UsageError(f"--image {item}: {first_error(exc)['msg'].removeprefix('Value error, ')}") from None
            continue
        path = Path(item)
        if not path.is_file():
            raise UsageError(
                f"--image {item}: no such file; give an image file (PNG, JPEG, GIF, WebP) or its https address"
            )
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise UsageError(f"--image {item}: {size:,} bytes, over the {MAX_IMAGE_BYTES:,} an image may be; shrink it")
        data = path.read_bytes()
        kind = image_kind(data[:12])
        if kind is None:
            raise UsageError(f"--image {item}: not a PNG, JPEG, GIF or WebP image; give one of these")
        images.append(ImageInput(url=f"data:image/{kind};base64,{base64.b64encode(data).decode()}"))
    return images
