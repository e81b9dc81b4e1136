"""One engine start from its recording to its outcome: opened before ``create_engine_config`` (explicit
arguments, an id, the children's spool), measured (NVML, the model, a serving profile), resolved after it,
then passed (one line in ``starts.jsonl``) or failed (an incident card as well)."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from oomdoctor.engines.vllm.plugin import card, profile, record
from oomdoctor.engines.vllm.plugin.capture import cleanup_spools, remove_spool
from oomdoctor.engines.vllm.plugin.record import MEMORY_FIELDS, SERVE_CONTEXTS
from oomdoctor.engines.vllm.plugin.state import (ENV_LOG, ENV_OWNER, ENV_PROFILES, ENV_SPOOL, ENV_STARTS, LOCK, S,
                                                 StartRecord, log)
from oomdoctor.engines.vllm.plugin.values import jsonable, plain


@dataclasses.dataclass
class Launch:
    """What is known of a start before anything is measured: how it was launched and what the caller set."""
    usage: str | None
    serve: bool
    argv: list[str] | None
    explicit: dict[str, Any]
    defaults: dict[str, Any]
    defaults_source: str
    sid: str
    spool: str


def open_start(ea: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Launch:
    """The launcher, the explicit arguments, a start id and the spool its children will write to."""
    usage = record.usage_of(args, kwargs)
    serve = usage in SERVE_CONTEXTS or (usage != "LLM_CLASS" and "serve" in sys.argv[1:3])
    argv = list(sys.argv) if serve else None
    explicit, defaults, how = record.explicit_args(ea, argv[1:] if argv else None)
    sid, spool = _open_spool()
    return Launch(usage, serve, argv, explicit, defaults, how, sid, spool)


def _open_spool() -> tuple[str, str]:
    with LOCK:
        S["seq"] += 1
        sid = f"{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}-{S['seq']}"
        # the children this start will create (engine core, workers) spool their log records here
        import tempfile  # noqa: PLC0415

        spool = os.path.join(tempfile.gettempdir(), f"oomdoctor-spool-{sid}")
        os.environ[ENV_SPOOL] = spool
        os.environ[ENV_OWNER] = str(os.getpid())
        S["spools"].append(spool)
        if not S["atexit"]:
            import atexit  # noqa: PLC0415

            atexit.register(cleanup_spools)
            S["atexit"] = True
    return sid, spool


def _world(ea: Any) -> int:
    world = 1
    for k in ("tensor_parallel_size", "pipeline_parallel_size"):
        try:
            world *= int(getattr(ea, k, 1) or 1)
        except (TypeError, ValueError):
            pass
    return world


def _engine_memory(dev: dict[str, Any], world: int) -> tuple[list[int], int | None, int | None]:
    """The engine's GPUs and the smallest free and total memory among them (None without NVML)."""
    idx = record.engine_gpus(dev, world) if dev.get("status") == "captured" else []
    sel_gpus = [g for g in dev.get("gpus", []) if g["index"] in idx]
    free = min((g["free_bytes"] for g in sel_gpus), default=None)
    total = min((g["total_bytes"] for g in sel_gpus), default=None)
    return idx, free, total


def measure_start(ea: Any, launch: Launch) -> StartRecord:
    """The start's record: NVML, the model, the defaults left alone; with OOMDOCTOR_PROFILES a profile applied."""
    dev = record.capture_device()
    idx, free, total = _engine_memory(dev, _world(ea))
    minfo = record.model_info(getattr(ea, "model", None), getattr(ea, "revision", None))
    start = _start_record(ea, launch, dev, minfo, idx, free, total)
    _log_recording(start)
    if os.environ.get(ENV_PROFILES):
        start["profile"] = profile.apply_profile(ea, launch.explicit, launch.defaults, minfo, free, total)
        start["applied"] = dict((start["profile"] or {}).get("applied") or {})
    with LOCK:
        S["last"] = start
    return start


def _start_record(ea: Any, launch: Launch, dev: dict[str, Any], minfo: dict[str, Any], idx: list[int],
                  free: int | None, total: int | None) -> StartRecord:
    explicit, defaults = launch.explicit, launch.defaults
    return {
        "id": launch.sid, "pid": os.getpid(), "at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "t0": time.time(), "log_from": S["log_from"],
        "oomdoctor_version": record.oomdoctor_version(),
        "engine": {"name": "vllm", "version": record.engine_version()},
        "usage_context": launch.usage, "launcher": "vllm-serve" if launch.serve else "vllm-llm",
        "engine_args_class": f"{type(ea).__module__}.{type(ea).__qualname__}",
        "model": minfo,
        "explicit": {k: jsonable(v) for k, v in explicit.items()},
        "explicit_names": sorted(explicit),
        "explicit_not_plain": sorted(k for k, v in explicit.items() if not plain(v)),
        "defaults_source": launch.defaults_source,
        "defaults": {k: jsonable(defaults[k]) for k in MEMORY_FIELDS if k in defaults},
        "left_at_default": sorted(k for k in MEMORY_FIELDS if k in defaults and k not in explicit),
        "device": dev, "engine_gpus": idx, "free_bytes": free, "total_bytes": total,
        "argv": launch.argv, "env": record.env_snapshot(), "spool": launch.spool, "outcome": "pending",
        "log": {"file": os.environ.get(ENV_LOG) or None, "capture": "vllm logger handler + child spool"},
        "profile": None, "applied": {},
    }


def _log_recording(start: StartRecord) -> None:
    dev, idx, free, total = start["device"], start["engine_gpus"], start["free_bytes"], start["total_bytes"]
    n_exp = [k for k in start["explicit_names"] if k != "disable_log_stats"]
    log.info("oomdoctor: recording start %s (%s, vLLM %s): explicit %s; %s GPU(s) %s: %s B free of %s B",
             start["id"], start["launcher"], start["engine"]["version"], n_exp or "none",
             "NVML" if dev.get("status") == "captured" else f"NVML {dev.get('status')} ({dev.get('reason')})",
             idx, f"{free:,}" if free is not None else "?", f"{total:,}" if total is not None else "?")


def after_config(start: StartRecord, cfg: Any) -> None:
    """The memory settings vLLM resolved (its VllmConfig); the start waits for its engine under id(cfg)."""
    g = getattr
    mc, cc = g(cfg, "model_config", None), g(cfg, "cache_config", None)
    sc, pc = g(cfg, "scheduler_config", None), g(cfg, "parallel_config", None)
    r = {"max_model_len": g(mc, "max_model_len", None), "gpu_memory_utilization": g(cc, "gpu_memory_utilization", None),
         "kv_cache_memory_bytes": g(cc, "kv_cache_memory_bytes", None), "kv_cache_dtype": g(cc, "cache_dtype", None),
         "block_size": g(cc, "block_size", None), "max_num_seqs": g(sc, "max_num_seqs", None),
         "max_num_batched_tokens": g(sc, "max_num_batched_tokens", None),
         "tensor_parallel_size": g(pc, "tensor_parallel_size", None),
         "pipeline_parallel_size": g(pc, "pipeline_parallel_size", None),
         "data_parallel_size": g(pc, "data_parallel_size", None),
         "enforce_eager": g(mc, "enforce_eager", None), "quantization": g(mc, "quantization", None),
         "dtype": g(mc, "dtype", None)}
    start["resolved"] = {k: jsonable(v) for k, v in r.items()}
    with LOCK:
        S["pending"][id(cfg)] = start
        S["last"] = start
    log.info("oomdoctor: start %s resolved: %s", start["id"],
             ", ".join(f"{k}={v}" for k, v in start["resolved"].items() if v is not None))


def _finish(start: StartRecord) -> None:
    with LOCK:
        S["log_from"] = time.time()
        for k, v in list(S["pending"].items()):
            if v is start:
                S["pending"].pop(k, None)


def started(start: StartRecord) -> None:
    start["outcome"] = "started"
    start["started_after_s"] = round(time.time() - start["t0"], 1)
    _finish(start)
    remove_spool(start.get("spool"))
    append_start(start)
    log.info("oomdoctor: start %s passed (engine up after %.1f s)%s", start["id"], start["started_after_s"],
             f"; profile {(start.get('profile') or {})['selected']}" if (start.get("profile") or {}).get("selected")
             else "")


def failed(start: StartRecord, exc: BaseException, stage: str, where: str | None = None) -> None:
    try:
        exc._oomdoctor_recorded = True  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
    if start.get("outcome") != "pending":
        return
    start["outcome"] = "failed"
    start["failure"] = {"stage": stage, "where": where or "EngineArgs.create_engine_config",
                        "exception": type(exc).__name__, "message": str(exc)[:2000],
                        "after_s": round(time.time() - start["t0"], 1)}
    _finish(start)
    path = None
    try:
        path = card.write_card(start, exc)
        start["card"] = str(path)
    finally:
        append_start(start)
        remove_spool(start.get("spool"))
    if path is not None:
        log.error("oomdoctor: start %s failed (%s: %s); incident card %s — re-run it with: oomdoctor retest %s",
                  start["id"], stage, type(exc).__name__, path, path)


def append_start(start: StartRecord) -> None:
    dest = os.environ.get(ENV_STARTS)
    if dest is not None and dest.strip().lower() in ("0", "", "off", "no", "false"):
        return
    path = Path(dest) if dest else card.incidents_dir() / "starts.jsonl"
    from oomdoctor.redact import redact_obj  # noqa: PLC0415

    rec = redact_obj(jsonable({k: v for k, v in start.items() if k not in ("t0", "log_from", "spool")}))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=False) + "\n")
