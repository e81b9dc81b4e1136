"""Plain copies of vLLM's values: what is written to a card or ``starts.jsonl``, and whether retest can pass it back."""
from __future__ import annotations

import dataclasses
from typing import Any


def jsonable(v: Any, depth: int = 0) -> Any:
    """A plain (JSON/YAML-safe) copy; enums by value, dataclasses and pydantic models as dicts, the rest repr."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if depth > 8:
        return repr(v)
    import enum  # noqa: PLC0415

    if isinstance(v, enum.Enum):
        return jsonable(v.value, depth + 1)
    if isinstance(v, dict):
        return {str(k): jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x, depth + 1) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((jsonable(x, depth + 1) for x in v), key=repr)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        try:
            return {f.name: jsonable(getattr(v, f.name, None), depth + 1) for f in dataclasses.fields(v)}
        except Exception:  # noqa: BLE001
            return repr(v)
    dump = getattr(v, "model_dump", None)
    if callable(dump):
        try:
            return jsonable(dump(mode="json"), depth + 1)
        except Exception:  # noqa: BLE001
            pass
    if type(v).__module__ == "torch":
        return str(v).replace("torch.", "")
    return repr(v)


def plain(v: Any, depth: int = 0) -> bool:
    """True when ``jsonable(v)`` is a faithful value that retest can pass back (kwarg or flag)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if depth > 8:
        return False
    import enum  # noqa: PLC0415

    if isinstance(v, enum.Enum):
        return True
    if isinstance(v, dict):
        return all(plain(x, depth + 1) for x in v.values())
    if isinstance(v, (list, tuple, set, frozenset)):
        return all(plain(x, depth + 1) for x in v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return True            # vLLM takes its config dataclasses as dicts (kwargs) and JSON (flags)
    if callable(getattr(v, "model_dump", None)) or type(v).__module__ == "torch":
        return True
    return False


