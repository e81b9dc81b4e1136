"""Reading a model directory: ``config.json`` and the safetensors *headers* (tensor data is never read)."""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from oomdoctor.engines.vllm.memory.common import MiB
from oomdoctor.errors import BadInput

#: safetensors dtype tags -> bytes per element (F4 packs two values per byte).
SAFETENSORS_DTYPE_BYTES: dict[str, float] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "U16": 2,
    "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FN": 1, "F4": 0.5,
    "F6_E2M3": 0.75, "F6_E3M2": 0.75, "E8M0": 1,
}
_FLOAT_TAGS = {"F64", "F32", "F16", "BF16"}


def read_config(model_dir: Union[str, Path]) -> dict[str, Any]:
    """Read ``model_dir/config.json``. Raises BadInput naming the file when it is missing or malformed."""
    path = Path(model_dir)
    cfg_path = path / "config.json" if path.is_dir() or not path.name.endswith(".json") else path
    if not path.exists():
        raise BadInput(f"model directory not found: {model_dir}")
    if not cfg_path.is_file():
        raise BadInput(f"no config.json in {model_dir} (a HF-style model directory needs one)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read {cfg_path}: {e}") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"malformed JSON in {cfg_path}: {e.msg} at line {e.lineno}") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{cfg_path} must hold a JSON object, not {type(cfg).__name__}")
    return cfg


def read_safetensors_header(path: Union[str, Path]) -> dict[str, Any]:
    """The JSON header of one ``.safetensors`` file: 8-byte little-endian length, then that many bytes
    of JSON. Tensor data is never read."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise BadInput(f"{p}: too short for a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            size = p.stat().st_size
            if n <= 0 or 8 + n > size or n > 100 * MiB:
                raise BadInput(f"{p}: implausible safetensors header length {n} for a {size}-byte file")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise BadInput(f"cannot read {p}: {e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"{p}: malformed safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise BadInput(f"{p}: safetensors header is not a JSON object")
    return header


@dataclass(frozen=True)
class SafetensorsSummary:
    files: int
    tensors: int
    file_bytes: int              # sizes on disk (headers included)
    tensor_bytes: int            # sum of the tensors' data, as stored
    loaded_bytes: int            # floating tensors counted at the model dtype (vLLM casts them on load)
    bytes_by_dtype: dict[str, int]


def _tensor_bytes(fp: Path, name: str, t: Any, model_dtype_bytes: int | None) -> tuple[str, int, int]:
    """(dtype tag, bytes as stored, bytes once loaded) of one header entry."""
    if not isinstance(t, dict) or "dtype" not in t or "shape" not in t:
        raise BadInput(f"{fp}: tensor {name!r} lacks dtype/shape in the header")
    tag = str(t["dtype"]).upper()
    if tag not in SAFETENSORS_DTYPE_BYTES:
        raise BadInput(f"{fp}: tensor {name!r} has an unknown dtype {tag!r}")
    numel = math.prod(int(d) for d in t["shape"])
    offs = t.get("data_offsets")
    nbytes = int(offs[1]) - int(offs[0]) if isinstance(offs, list) and len(offs) == 2 else \
        math.ceil(numel * SAFETENSORS_DTYPE_BYTES[tag])
    lowered = name.lower()
    if model_dtype_bytes and tag in _FLOAT_TAGS and "scale" not in lowered and "zero" not in lowered:
        return tag, nbytes, numel * model_dtype_bytes
    return tag, nbytes, nbytes


def safetensors_summary(model_dir: Union[str, Path], model_dtype_bytes: int | None = None) -> SafetensorsSummary | None:
    """Sum the tensor sizes declared in the headers of every ``*.safetensors`` in ``model_dir``.
    None when there are none. ``loaded_bytes`` counts 16/32/64-bit float tensors at ``model_dtype_bytes``
    (vLLM loads them into parameters of the model dtype); quantized/int tensors count as stored."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        return None
    tensors = tensor_bytes = loaded = file_bytes = 0
    by_dtype: dict[str, int] = {}
    for fp in files:
        header = read_safetensors_header(fp)
        file_bytes += fp.stat().st_size
        for name, t in header.items():
            if name == "__metadata__":
                continue
            tag, nbytes, loaded_bytes = _tensor_bytes(fp, name, t, model_dtype_bytes)
            tensors += 1
            tensor_bytes += nbytes
            by_dtype[tag] = by_dtype.get(tag, 0) + nbytes
            loaded += loaded_bytes
    return SafetensorsSummary(len(files), tensors, file_bytes, tensor_bytes, loaded, by_dtype)


def safetensors_index_total(model_dir: Union[str, Path]) -> int | None:
    """``metadata.total_size`` of ``model.safetensors.index.json`` (when only the index was fetched)."""
    idx = Path(model_dir) / "model.safetensors.index.json"
    if not idx.is_file():
        return None
    try:
        total = json.loads(idx.read_text(encoding="utf-8")).get("metadata", {}).get("total_size")
    except (OSError, json.JSONDecodeError, AttributeError) as e:
        raise BadInput(f"malformed {idx}: {e}") from None
    return int(total) if isinstance(total, (int, float)) and total > 0 else None
