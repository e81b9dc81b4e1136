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

    from oomdoctor import safeyaml  # noqa: PLC0415

    try:
        return safeyaml.load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        prob = getattr(e, "problem", None) or "malformed"
        raise BadInput(f"{origin}: malformed YAML{f' at line {mark.line + 1}' if mark else ''}: {prob}")


def load_doc(text: str, origin: str) -> Any:
    """A profiles file's text → its document (JSON when ``origin`` ends in .json, else YAML)."""
    if origin.lower().endswith(".json"):
        from oomdoctor import safeyaml  # noqa: PLC0415

        try:
            return safeyaml.check(json.loads(text))
        except RecursionError:
            raise BadInput(f"{origin}: not valid JSON: nested too deeply")
        except safeyaml.YAMLLimit as e:
            raise BadInput(f"{origin}: {e.problem}")
        except ValueError as e:
            msg = f"{e.msg} at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
            raise BadInput(f"{origin}: not valid JSON: {msg}")
    return load_yaml(text, origin)


def read_doc(path: str | os.PathLike) -> Any:
    from oomdoctor import safeyaml  # noqa: PLC0415
    from oomdoctor.diagnose.read import read_capped  # noqa: PLC0415

    p = Path(path)
    try:
        text = read_capped(p, safeyaml.MAX_BYTES, "profiles file").decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise BadInput(f"{p}: cannot be read ({e})")
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
