"""What a start records about itself: the arguments the caller set (against vLLM's own defaults), the model's
config, the GPUs the engine will use, the environment, the versions."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from oomdoctor.engines.vllm.plugin.argv import argv_fields
from oomdoctor.engines.vllm.plugin.values import jsonable

# the memory-shaping EngineArgs fields whose defaults are recorded (all fields are compared for "explicit")
MEMORY_FIELDS = ("max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes", "kv_cache_dtype", "max_num_seqs",
                 "max_num_batched_tokens", "block_size", "enforce_eager", "tensor_parallel_size",
                 "pipeline_parallel_size", "data_parallel_size", "quantization", "dtype", "cpu_offload_gb",
                 "enable_prefix_caching", "enable_chunked_prefill", "max_cudagraph_capture_size",
                 "cudagraph_capture_sizes", "num_gpu_blocks_override", "kv_offloading_size", "performance_mode")
# env kept in the card's workload (the same families `oomdoctor record` keeps); OOMDOCTOR_* never
ENV_PREFIXES = ("VLLM_", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "HF_", "TRANSFORMERS_", "NCCL_")
SERVE_CONTEXTS = ("OPENAI_API_SERVER", "API_SERVER")


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _differs(a: Any, b: Any) -> bool:
    try:
        return bool(a != b)
    except Exception:  # noqa: BLE001 - an __eq__ that raises: compare what we can show
        return repr(a) != repr(b)


def explicit_args(engine_args: Any, argv: list[str] | None = None) -> tuple[dict, dict, str]:
    """(explicit {field: value}, defaults {field: value}, how the defaults were read).

    The defaults come from vLLM itself: a default-constructed ``type(engine_args)(model=...)`` (what
    vLLM's ``get_non_default_args`` compares against), else the dataclass fields' own defaults.
    ``argv`` (a ``vllm serve`` command line) adds the flags the user typed even when their value equals
    the default."""
    cls = type(engine_args)
    fields = dataclasses.fields(cls)
    ref = None
    source = f"{cls.__name__}(model=...) default-constructed (vLLM's own non-default comparison)"
    try:
        ref = cls(model=engine_args.model)
    except Exception as e:  # noqa: BLE001
        source = f"dataclasses.fields({cls.__name__}) defaults ({cls.__name__}(model=...) failed: {type(e).__name__})"
    explicit: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    for f in fields:
        cur = getattr(engine_args, f.name, None)
        d = getattr(ref, f.name, None) if ref is not None else _field_default(f)
        if d is dataclasses.MISSING:
            explicit[f.name] = cur
            continue
        defaults[f.name] = d
        if f.name != "model" and _differs(cur, d):
            explicit[f.name] = cur
    for name in argv_fields(argv or [], [f.name for f in fields]):
        if name != "model":
            explicit.setdefault(name, getattr(engine_args, name, None))
    return explicit, defaults, source


def model_info(model: Any, revision: Any = None) -> dict:
    out: dict[str, Any] = {"path": str(model), "revision": jsonable(revision)}
    try:
        p = Path(str(model))
        cfg = p / "config.json"
        out["local"] = p.is_dir()
        if cfg.is_file():
            data = cfg.read_bytes()
            out["config_json"] = str(cfg)
            out["config_sha256"] = hashlib.sha256(data).hexdigest()
            try:
                c = json.loads(data)
                for k in ("architectures", "model_type", "max_position_embeddings", "torch_dtype", "num_hidden_layers",
                          "num_key_value_heads", "hidden_size"):
                    if k in c:
                        out.setdefault("config", {})[k] = jsonable(c[k])
            except ValueError:
                out["config_note"] = "config.json is not valid JSON"
        elif out["local"]:
            out["config_note"] = "no config.json in the model folder"
        else:
            out["config_note"] = "not a local folder (a hub id?): no config.json hashed"
    except OSError as e:
        out["config_note"] = f"cannot read: {e}"
    return out


def engine_gpus(state: dict, world: int) -> list[int]:
    """NVML indices of the GPUs the engine will use: CUDA_VISIBLE_DEVICES order, the first ``world``."""
    gpus = state.get("gpus") or []
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        order = [g["index"] for g in gpus]
    else:
        order = []
        for tok in (t.strip() for t in cvd.split(",") if t.strip()):
            if tok.lstrip("-").isdigit():
                if int(tok) < 0:
                    break
                order.append(int(tok))
            else:
                for g in gpus:
                    if tok in str(g.get("uuid", "")):
                        order.append(g["index"])
                        break
    have = {g["index"] for g in gpus}
    return [i for i in order if i in have][:max(1, world)]


def env_snapshot() -> dict:
    from oomdoctor.redact import redact_env  # noqa: PLC0415

    return redact_env({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)})


def usage_of(args: tuple, kwargs: dict) -> str | None:
    u = kwargs.get("usage_context", args[0] if args else None)
    if u is None:
        return None
    return str(getattr(u, "value", u))


def engine_version() -> str | None:
    v = getattr(sys.modules.get("vllm"), "__version__", None)
    return str(v) if v is not None else None


def capture_device() -> dict:
    from oomdoctor.device import nvml as device  # noqa: PLC0415

    return device.capture()


def oomdoctor_version() -> str:
    from oomdoctor import __version__  # noqa: PLC0415

    return __version__


