"""Reading the files the profile stage reads (profiles files, ladder cards and receipts): YAML or JSON, sizes."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from oomdoctor.errors import BadInput
from oomdoctor.units import parse_size


def load_yaml(text: str, origin: str) -> Any:
    import yaml  # noqa: PLC0415 - only when a YAML file is read

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        prob = getattr(e, "problem", None) or "malformed"
        raise BadInput(f"{origin}: malformed YAML{f' at line {mark.line + 1}' if mark else ''}: {prob}")


def load_doc(text: str, origin: str) -> Any:
    """A profiles file's text → its document (JSON when ``origin`` ends in .json, else YAML)."""
    if origin.lower().endswith(".json"):
        try:
            return json.loads(text)
        except ValueError as e:
            msg = f"{e.msg} at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
            raise BadInput(f"{origin}: not valid JSON: {msg}")
    return load_yaml(text, origin)


def read_doc(path: str | os.PathLike) -> Any:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{p}: cannot be read ({getattr(e, 'strerror', None) or e})")
    return load_doc(text, str(p))


def size(v: Any, what: str) -> int:
    """A size in bytes (int, whole float, or text for :func:`oomdoctor.units.parse_size`)."""
    if isinstance(v, bool):
        raise BadInput(f"{what}: {v!r} is not a size in bytes")
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if v != int(v):
            raise BadInput(f"{what}: {v!r} is not a whole number of bytes")
        return int(v)
    return parse_size(str(v))
