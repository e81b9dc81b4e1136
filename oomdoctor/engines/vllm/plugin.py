"""oomdoctor as a vLLM general plugin: every engine start recorded at the source, measured profiles applied.

vLLM calls :func:`register` (entry point ``vllm.general_plugins: oomdoctor = oomdoctor.engines.vllm.plugin:register``)
with no arguments, once per process, in EVERY process: the front end (``LLM(...)`` or ``vllm serve``),
the engine core and the workers. It does nothing at all unless ``OOMDOCTOR_PLUGIN=1``: installing
oomdoctor never changes anyone's engine.

When on, it hooks (idempotently, class/module attributes looked up at call time, so it works however
vLLM imported them):

* ``vllm.engine.arg_utils.EngineArgs.create_engine_config`` — the one funnel through which both
  ``vllm serve`` (``api_server.build_async_engine_client_from_engine_args``, ``cli/serve.py`` for
  headless / several API servers) and the offline ``LLM`` (``LLMEngine.from_engine_args``) build their
  ``VllmConfig``, in the front end; same name in vLLM 0.25.1 (``arg_utils.py:1818``) and 0.33.0
  (``:2245``). Before the call it records which arguments the caller set (each field compared with a
  default-constructed ``EngineArgs(model=...)``, exactly as vLLM's own "non-default args" line does, plus
  the flags named on a ``vllm serve`` command line), NVML free/total of every GPU, the vLLM version and
  the model's config; with ``OOMDOCTOR_PROFILES`` it selects a measured serving profile and fills only
  fields left at their defaults. After the call it records the resolved memory settings.
* ``vllm.v1.engine.llm_engine.LLMEngine.__init__``, ``vllm.v1.engine.async_llm.AsyncLLM.__init__`` and
  ``vllm.v1.engine.utils.wait_for_engine_startup`` — installed lazily, only in a process that called
  ``create_engine_config`` (the front end): a start-up failure is recorded and re-raised untouched.
* a ``logging.Handler`` on the ``vllm`` logger (bounded: the last ``OOMDOCTOR_PLUGIN_TAIL_LINES``
  records, default 2000). In the engine-core and worker processes (which the front end's logger never
  sees) the same handler appends their records to a spool folder the front end reads on failure.
  ``OOMDOCTOR_PLUGIN_LOG=path`` points the plugin at a log file with the whole output instead.

On a failure (``create_engine_config`` raises, or the engine start does) it writes an incident card
(schema ``oomdoctor.incident/v1``, built by :func:`oomdoctor.commands.diagnose.build_card` from the
captured log) into ``OOMDOCTOR_INCIDENTS`` (default ``./incidents``) whose workload
(``vllm-llm`` kwargs or ``vllm-serve`` flags) lets ``oomdoctor retest`` re-run exactly that launch.
Every start, passing or failing, is appended to ``<incidents>/starts.jsonl`` (``OOMDOCTOR_PLUGIN_STARTS``
= another path, or ``0`` for none).

The plugin never breaks a start: every error of its own is logged under ``vllm.oomdoctor`` and
swallowed; the engine's own result or exception passes through unchanged.
"""
from __future__ import annotations

import collections
import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ENV_ON = "OOMDOCTOR_PLUGIN"
ENV_LOG = "OOMDOCTOR_PLUGIN_LOG"
ENV_TAIL = "OOMDOCTOR_PLUGIN_TAIL_LINES"
ENV_STARTS = "OOMDOCTOR_PLUGIN_STARTS"
ENV_INCIDENTS = "OOMDOCTOR_INCIDENTS"
ENV_PROFILES = "OOMDOCTOR_PROFILES"
ENV_PROFILE = "OOMDOCTOR_PROFILE"
ENV_ALLOW_UNMEASURED = "OOMDOCTOR_PROFILE_ALLOW_UNMEASURED"
ENV_SPOOL = "OOMDOCTOR_PLUGIN_SPOOL"           # set by the front end for its children (internal)
ENV_OWNER = "OOMDOCTOR_PLUGIN_SPOOL_OWNER"     # pid of that front end (internal)
DEFAULT_TAIL = 2000
SPOOL_CAP_BYTES = 32 << 20
MARK = "__oomdoctor_wrapped__"
# the memory-shaping EngineArgs fields whose defaults are recorded (all fields are compared for "explicit")
MEMORY_FIELDS = ("max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes", "kv_cache_dtype", "max_num_seqs",
                 "max_num_batched_tokens", "block_size", "enforce_eager", "tensor_parallel_size",
                 "pipeline_parallel_size", "data_parallel_size", "quantization", "dtype", "cpu_offload_gb",
                 "enable_prefix_caching", "enable_chunked_prefill", "max_cudagraph_capture_size",
                 "cudagraph_capture_sizes", "num_gpu_blocks_override", "kv_offloading_size", "performance_mode")
# env kept in the card's workload (the same families `oomdoctor record` keeps); OOMDOCTOR_* never
ENV_PREFIXES = ("VLLM_", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "HF_", "TRANSFORMERS_", "NCCL_")
SERVE_CONTEXTS = ("OPENAI_API_SERVER", "API_SERVER")

log = logging.getLogger("vllm.oomdoctor")
_LOCK = threading.RLock()
_TLS = threading.local()
_S: dict[str, Any] = {"registered": False, "handler": None, "pending": {}, "last": None, "seq": 0,
                      "log_from": 0.0, "start_hooks": False, "spools": [], "atexit": False}


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def enabled() -> bool:
    return _truthy(os.environ.get(ENV_ON))


def _own_error(where: str) -> None:
    """An error of the plugin itself: one warning under vLLM's logger, never raised."""
    try:
        e = sys.exc_info()[1]
        log.warning("oomdoctor plugin: internal error in %s (ignored; the engine is not affected): %s: %s",
                    where, type(e).__name__, e)
        log.debug("oomdoctor plugin: traceback of the internal error", exc_info=True)
    except Exception:  # noqa: BLE001
        pass


# ----------------------------------------------------------------------------- entry point
def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point. Off unless OOMDOCTOR_PLUGIN=1; idempotent; never raises."""
    if not enabled():
        return
    try:
        with _LOCK:
            _install_capture()
            if _S["registered"]:
                return
            if _is_child() and "vllm.engine.arg_utils" not in sys.modules:
                return          # an engine core / worker: only the log capture (no config is built here)
            _wrap_create_engine_config()
            _S["registered"] = True
    except Exception:  # noqa: BLE001
        _own_error("register")


def _is_child() -> bool:
    """A process started by a front end that runs the plugin (engine core, workers)."""
    owner = os.environ.get(ENV_OWNER)
    return bool(os.environ.get(ENV_SPOOL) and owner and owner != str(os.getpid()))


def _wrap_create_engine_config() -> None:
    from vllm.engine.arg_utils import EngineArgs  # noqa: PLC0415 - vLLM is imported by whoever calls us

    orig = EngineArgs.__dict__.get("create_engine_config")
    if orig is None or getattr(orig, MARK, False):
        return

    @functools.wraps(orig)
    def create_engine_config(self, *args, **kwargs):
        if getattr(_TLS, "depth", 0):            # a nested call (vLLM building a draft config): pass through
            return orig(self, *args, **kwargs)
        _TLS.depth = 1
        try:
            start = None
            try:
                start = _before_config(self, args, kwargs)
            except Exception:  # noqa: BLE001
                _own_error("recording the engine arguments")
            try:
                cfg = orig(self, *args, **kwargs)
            except Exception as exc:
                try:
                    if start is not None:
                        _failed(start, exc, "config")
                except Exception:  # noqa: BLE001
                    _own_error("writing the incident card")
                raise
            try:
                if start is not None:
                    _after_config(start, cfg)
            except Exception:  # noqa: BLE001
                _own_error("recording the resolved config")
            return cfg
        finally:
            _TLS.depth = 0

    setattr(create_engine_config, MARK, True)
    EngineArgs.create_engine_config = create_engine_config


# ----------------------------------------------------------------------------- log capture
class _Capture(logging.Handler):
    """Keeps the last N records of this process (vLLM's line format); in a child of a front end that
    runs the plugin (engine core, workers) also appends them to the front end's spool folder."""

    def __init__(self, maxlen: int):
        super().__init__(level=logging.NOTSET)
        self.buf: collections.deque = collections.deque(maxlen=maxlen)
        self._dead: set[str] = set()
        self._started: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            child = _is_child()
            text = format_record(record, child)
            self.buf.append((record.created, text))
            spool = os.environ.get(ENV_SPOOL, "")
            if child and spool not in self._dead:
                self._spool(spool, os.getpid(), record.created, text)
        except Exception:  # noqa: BLE001 - a log handler must never raise
            pass

    def _spool(self, spool: str, pid: int, t: float, text: str) -> None:
        path = os.path.join(spool, f"{pid}.jsonl")
        if spool not in self._started:
            os.makedirs(spool, exist_ok=True)
            self._started.add(spool)
        try:
            if os.path.getsize(path) > SPOOL_CAP_BYTES:
                self._dead.add(spool)
                return
        except OSError:
            pass
        try:
            with open(path, "a", encoding="utf-8") as f:   # open per record: no descriptor outlives the spool
                f.write(json.dumps({"t": t, "text": text}) + "\n")
        except OSError:                                   # the front end removed it (start passed): stop
            self._dead.add(spool)


def format_record(record: logging.LogRecord, child: bool = False) -> str:
    """vLLM's line format (``LEVEL MM-DD HH:MM:SS [file.py:N] message``), every line of a multi-line
    message with the same header, and the ``(Name pid=N)`` prefix for child processes."""
    try:
        msg = record.getMessage()
    except Exception:  # noqa: BLE001
        msg = str(record.msg)
    if record.exc_info:
        msg += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
    if record.stack_info:
        msg += "\n" + record.stack_info
    prefix = ""
    if child:
        name = getattr(record, "vllm_process_name", None)
        if not name:
            try:
                import multiprocessing  # noqa: PLC0415

                name = multiprocessing.current_process().name
            except Exception:  # noqa: BLE001
                name = "Process"
        prefix = f"({name} pid={record.process}) "
    ts = time.strftime("%m-%d %H:%M:%S", time.localtime(record.created))
    head = f"{prefix}{record.levelname} {ts} [{record.filename}:{record.lineno}] "
    return "\n".join(head + ln for ln in msg.split("\n"))


def _tail_n() -> int:
    try:
        return max(50, int(os.environ.get(ENV_TAIL, DEFAULT_TAIL)))
    except ValueError:
        return DEFAULT_TAIL


def _install_capture() -> None:
    h = _S["handler"]
    if h is None:
        h = _S["handler"] = _Capture(_tail_n())
    try:
        # first vllm.logger (its import configures the 'vllm' logger, dropping foreign handlers), then ours
        import vllm.logger as vlog  # noqa: PLC0415

        orig = getattr(vlog, "_configure_vllm_root_logger", None)
        if orig is not None and not getattr(orig, MARK, False):
            # 0.33.0 re-runs dictConfig (engine core, configure_logging_if_needed), which drops foreign
            # handlers from the 'vllm' logger: put ours back after every (re)configuration.
            @functools.wraps(orig)
            def _configure_vllm_root_logger(*a, **kw):
                try:
                    return orig(*a, **kw)
                finally:
                    _ensure_handler()

            setattr(_configure_vllm_root_logger, MARK, True)
            vlog._configure_vllm_root_logger = _configure_vllm_root_logger
    except Exception:  # noqa: BLE001
        _own_error("attaching the log capture to vllm.logger")
    _ensure_handler()


def _ensure_handler() -> None:
    h = _S["handler"]
    lg = logging.getLogger("vllm")
    if h is not None and h not in lg.handlers:
        lg.addHandler(h)


# ----------------------------------------------------------------------------- recording
def _jsonable(v: Any, depth: int = 0) -> Any:
    """A plain (JSON/YAML-safe) copy; enums by value, dataclasses and pydantic models as dicts, the rest repr."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if depth > 8:
        return repr(v)
    import enum  # noqa: PLC0415

    if isinstance(v, enum.Enum):
        return _jsonable(v.value, depth + 1)
    if isinstance(v, dict):
        return {str(k): _jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x, depth + 1) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((_jsonable(x, depth + 1) for x in v), key=repr)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        try:
            return {f.name: _jsonable(getattr(v, f.name, None), depth + 1) for f in dataclasses.fields(v)}
        except Exception:  # noqa: BLE001
            return repr(v)
    dump = getattr(v, "model_dump", None)
    if callable(dump):
        try:
            return _jsonable(dump(mode="json"), depth + 1)
        except Exception:  # noqa: BLE001
            pass
    if type(v).__module__ == "torch":
        return str(v).replace("torch.", "")
    return repr(v)


def _plain(v: Any, depth: int = 0) -> bool:
    """True when ``_jsonable(v)`` is a faithful value that retest can pass back (kwarg or flag)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if depth > 8:
        return False
    import enum  # noqa: PLC0415

    if isinstance(v, enum.Enum):
        return True
    if isinstance(v, dict):
        return all(_plain(x, depth + 1) for x in v.values())
    if isinstance(v, (list, tuple, set, frozenset)):
        return all(_plain(x, depth + 1) for x in v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return True            # vLLM takes its config dataclasses as dicts (kwargs) and JSON (flags)
    if callable(getattr(v, "model_dump", None)) or type(v).__module__ == "torch":
        return True
    return False


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


def argv_fields(argv: list[str], names: list[str]) -> list[str]:
    """EngineArgs fields named by flags on a command line (THE vLLM argv reader: engines/vllm/argv.py)."""
    from oomdoctor.engines.vllm.argv import flagged_fields  # noqa: PLC0415

    return flagged_fields(argv, names)


def model_info(model: Any, revision: Any = None) -> dict:
    out: dict[str, Any] = {"path": str(model), "revision": _jsonable(revision)}
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
                        out.setdefault("config", {})[k] = _jsonable(c[k])
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


def _env_snapshot() -> dict:
    from oomdoctor.redact import redact_env  # noqa: PLC0415

    return redact_env({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)})


def _usage(args: tuple, kwargs: dict) -> str | None:
    u = kwargs.get("usage_context", args[0] if args else None)
    if u is None:
        return None
    return str(getattr(u, "value", u))


def _engine_version() -> str | None:
    v = getattr(sys.modules.get("vllm"), "__version__", None)
    return str(v) if v is not None else None


def _capture_device() -> dict:
    from oomdoctor.device import nvml as device  # noqa: PLC0415

    return device.capture()


def _before_config(ea: Any, args: tuple, kwargs: dict) -> dict:
    usage = _usage(args, kwargs)
    serve = usage in SERVE_CONTEXTS or (usage != "LLM_CLASS" and "serve" in sys.argv[1:3])
    argv = list(sys.argv) if serve else None
    explicit, defaults, how = explicit_args(ea, argv[1:] if argv else None)
    with _LOCK:
        _S["seq"] += 1
        sid = f"{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}-{_S['seq']}"
        # the children this start will create (engine core, workers) spool their log records here
        import tempfile  # noqa: PLC0415

        spool = os.path.join(tempfile.gettempdir(), f"oomdoctor-spool-{sid}")
        os.environ[ENV_SPOOL] = spool
        os.environ[ENV_OWNER] = str(os.getpid())
        _S["spools"].append(spool)
        if not _S["atexit"]:
            import atexit  # noqa: PLC0415

            atexit.register(_cleanup_spools)
            _S["atexit"] = True
    _install_start_hooks()
    dev = _capture_device()
    world = 1
    for k in ("tensor_parallel_size", "pipeline_parallel_size"):
        try:
            world *= int(getattr(ea, k, 1) or 1)
        except (TypeError, ValueError):
            pass
    idx = engine_gpus(dev, world) if dev.get("status") == "captured" else []
    sel_gpus = [g for g in dev.get("gpus", []) if g["index"] in idx]
    free = min((g["free_bytes"] for g in sel_gpus), default=None)
    total = min((g["total_bytes"] for g in sel_gpus), default=None)
    minfo = model_info(getattr(ea, "model", None), getattr(ea, "revision", None))
    start: dict[str, Any] = {
        "id": sid, "pid": os.getpid(), "at": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "t0": time.time(), "log_from": _S["log_from"],
        "oomdoctor_version": _oomdoctor_version(),
        "engine": {"name": "vllm", "version": _engine_version()},
        "usage_context": usage, "launcher": "vllm-serve" if serve else "vllm-llm",
        "engine_args_class": f"{type(ea).__module__}.{type(ea).__qualname__}",
        "model": minfo,
        "explicit": {k: _jsonable(v) for k, v in explicit.items()},
        "explicit_names": sorted(explicit),
        "explicit_not_plain": sorted(k for k, v in explicit.items() if not _plain(v)),
        "defaults_source": how,
        "defaults": {k: _jsonable(defaults[k]) for k in MEMORY_FIELDS if k in defaults},
        "left_at_default": sorted(k for k in MEMORY_FIELDS if k in defaults and k not in explicit),
        "device": dev, "engine_gpus": idx, "free_bytes": free, "total_bytes": total,
        "argv": argv, "env": _env_snapshot(), "spool": spool, "outcome": "pending",
        "log": {"file": os.environ.get(ENV_LOG) or None, "capture": "vllm logger handler + child spool"},
        "profile": None, "applied": {},
    }
    n_exp = [k for k in start["explicit_names"] if k != "disable_log_stats"]
    log.info("oomdoctor: recording start %s (%s, vLLM %s): explicit %s; %s GPU(s) %s: %s B free of %s B",
             sid, start["launcher"], start["engine"]["version"], n_exp or "none",
             "NVML" if dev.get("status") == "captured" else f"NVML {dev.get('status')} ({dev.get('reason')})",
             idx, f"{free:,}" if free is not None else "?", f"{total:,}" if total is not None else "?")
    if os.environ.get(ENV_PROFILES):
        start["profile"] = _apply_profile(ea, explicit, defaults, minfo, free, total)
        start["applied"] = dict((start["profile"] or {}).get("applied") or {})
    with _LOCK:
        _S["last"] = start
    return start


def _oomdoctor_version() -> str:
    from oomdoctor import __version__  # noqa: PLC0415

    return __version__


def _apply_profile(ea: Any, explicit: dict, defaults: dict, minfo: dict, free: int | None, total: int | None) -> dict:
    from oomdoctor import profiles as prof  # noqa: PLC0415
    from oomdoctor.errors import BadInput  # noqa: PLC0415

    path = os.environ[ENV_PROFILES]
    try:
        ps = prof.load_profiles(path)
    except BadInput as e:
        log.warning("oomdoctor: profiles %s not used: %s", path, e)
        return {"file": path, "error": str(e), "selected": None}
    shown = dict(defaults)
    if shown.get("max_model_len") is None and (minfo.get("config") or {}).get("max_position_embeddings"):
        shown["max_model_len"] = minfo["config"]["max_position_embeddings"]   # what vLLM derives from (for the log)
    if free is None:
        log.info("oomdoctor: profiles: NVML unavailable, free memory unknown")
    sel = prof.select_profile(ps, free, total, explicit, os.environ.get(ENV_PROFILE) or None, defaults=shown,
                              engine_version=_engine_version(), allow_unmeasured=_truthy(os.environ.get(ENV_ALLOW_UNMEASURED)))
    for r in sel.reasons:
        log.info("oomdoctor: profiles: %s", r)
    for c in sel.candidates:
        if not c["eligible"]:
            log.info("oomdoctor: profiles: %s not eligible: %s", c["name"], c["why_not"] or "not the widest")
    applied: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    todo = [(k, v) for k, v in sel.changes.items()]
    unknown = [k for k, _ in todo if not hasattr(ea, k)]
    for k in unknown:
        skipped[k] = f"{type(ea).__name__} has no field {k} in this vLLM"
    old: dict[str, Any] = {}
    try:
        for k, v in todo:
            if k in unknown:
                continue
            old[k] = getattr(ea, k)
            setattr(ea, k, v)
            applied[k] = v
    except Exception:  # noqa: BLE001 - all or nothing
        for k, v in old.items():
            setattr(ea, k, v)
        applied = {}
        raise
    for line, s in zip(sel.log_lines(), sel.substitutions):
        if s.field in applied:
            log.info("%s", line)
    for k, why in skipped.items():
        log.warning("oomdoctor: profile field %s not applied: %s", k, why)
    for w in sel.warnings:
        log.warning("oomdoctor: %s", w)
    out = sel.to_dict()
    out.update(file=path, applied=_jsonable(applied), skipped=skipped)
    return out


def _after_config(start: dict, cfg: Any) -> None:
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
    start["resolved"] = {k: _jsonable(v) for k, v in r.items()}
    with _LOCK:
        _S["pending"][id(cfg)] = start
        _S["last"] = start
    log.info("oomdoctor: start %s resolved: %s", start["id"],
             ", ".join(f"{k}={v}" for k, v in start["resolved"].items() if v is not None))


# ----------------------------------------------------------------------------- engine start hooks
def _install_start_hooks() -> None:
    with _LOCK:
        if _S["start_hooks"]:
            return
        _S["start_hooks"] = True
    import importlib  # noqa: PLC0415

    for mod, cls in (("vllm.v1.engine.llm_engine", "LLMEngine"), ("vllm.v1.engine.async_llm", "AsyncLLM")):
        try:
            c = getattr(importlib.import_module(mod), cls)
            orig = c.__dict__.get("__init__")
            if orig is not None and not getattr(orig, MARK, False):
                w = _wrap_start(orig, f"{cls}.__init__")
                c.__init__ = w
        except Exception:  # noqa: BLE001
            _own_error(f"hooking {mod}.{cls}.__init__")
    try:
        m = importlib.import_module("vllm.v1.engine.utils")
        orig = getattr(m, "wait_for_engine_startup", None)
        if orig is not None and not getattr(orig, MARK, False):
            m.wait_for_engine_startup = _wrap_start(orig, "wait_for_engine_startup", is_init=False)
    except Exception:  # noqa: BLE001
        _own_error("hooking vllm.v1.engine.utils.wait_for_engine_startup")


def _start_for(args: tuple, kwargs: dict) -> dict | None:
    cfg = kwargs.get("vllm_config")
    if cfg is None:
        for a in args:
            if type(a).__name__ == "VllmConfig":
                cfg = a
                break
    with _LOCK:
        if cfg is not None and id(cfg) in _S["pending"]:
            return _S["pending"][id(cfg)]
        last = _S["last"]
        return last if last is not None and last.get("outcome") == "pending" else None


def _wrap_start(orig: Callable, name: str, is_init: bool = True) -> Callable:
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        start = None
        try:
            start = _start_for(args[1:] if is_init else args, kwargs)
        except Exception:  # noqa: BLE001
            _own_error(f"{name}: finding the recorded start")
        try:
            result = orig(*args, **kwargs)
        except Exception as exc:
            try:
                if start is not None and not getattr(exc, "_oomdoctor_recorded", False):
                    _failed(start, exc, "engine_start", where=name)
            except Exception:  # noqa: BLE001
                _own_error("writing the incident card")
            raise
        if is_init:
            try:
                if start is not None and start.get("outcome") == "pending":
                    _started(start)
            except Exception:  # noqa: BLE001
                _own_error("recording the passing start")
        return result

    setattr(wrapper, MARK, True)
    return wrapper


def _finish(start: dict) -> None:
    with _LOCK:
        _S["log_from"] = time.time()
        for k, v in list(_S["pending"].items()):
            if v is start:
                _S["pending"].pop(k, None)


def _started(start: dict) -> None:
    start["outcome"] = "started"
    start["started_after_s"] = round(time.time() - start["t0"], 1)
    _finish(start)
    _remove_spool(start.get("spool"))
    _append_start(start)
    log.info("oomdoctor: start %s passed (engine up after %.1f s)%s", start["id"], start["started_after_s"],
             f"; profile {start['profile']['selected']}" if (start.get("profile") or {}).get("selected") else "")


def _failed(start: dict, exc: BaseException, stage: str, where: str | None = None) -> None:
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
        path = write_card(start, exc)
        start["card"] = str(path)
    finally:
        _append_start(start)
        _remove_spool(start.get("spool"))
    if path is not None:
        log.error("oomdoctor: start %s failed (%s: %s); incident card %s — re-run it with: oomdoctor retest %s",
                  start["id"], stage, type(exc).__name__, path, path)


def _remove_spool(spool: str | None) -> None:
    if not spool:
        return
    import shutil  # noqa: PLC0415

    shutil.rmtree(spool, ignore_errors=True)


def _cleanup_spools() -> None:
    for s in list(_S["spools"]):
        _remove_spool(s)


def incidents_dir() -> Path:
    env = os.environ.get(ENV_INCIDENTS)
    return Path(env) if env else Path.cwd() / "incidents"


def _append_start(start: dict) -> None:
    dest = os.environ.get(ENV_STARTS)
    if dest is not None and dest.strip().lower() in ("0", "", "off", "no", "false"):
        return
    path = Path(dest) if dest else incidents_dir() / "starts.jsonl"
    from oomdoctor.redact import redact_obj  # noqa: PLC0415

    rec = redact_obj(_jsonable({k: v for k, v in start.items() if k not in ("t0", "log_from", "spool")}))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=False) + "\n")


# ----------------------------------------------------------------------------- the card
def _read_tail(path: Path, n: int) -> list[str]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size > (16 << 20):
            f.seek(size - (16 << 20))
        data = f.read()
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:]


def collect_log(start: dict, exc: BaseException | None) -> tuple[list[str], dict]:
    """The log lines of this start and a description of where they came from."""
    n = _tail_n()
    src: dict[str, Any] = {"tail_lines": n}
    h = _S["handler"]
    own = [(t, s) for t, s in (list(h.buf) if h is not None else []) if t >= start.get("log_from", 0)]
    children: list[tuple[float, str]] = []
    kids: dict[str, int] = {}
    spool = start.get("spool")
    if spool and os.path.isdir(spool):
        for fn in sorted(os.listdir(spool)):
            if not fn.endswith(".jsonl"):
                continue
            got = []
            try:
                for ln in _read_tail(Path(spool) / fn, n):
                    try:
                        d = json.loads(ln)
                        got.append((float(d["t"]), str(d["text"])))
                    except (ValueError, KeyError, TypeError):
                        continue
            except OSError:
                continue
            kids[fn[:-6]] = len(got)
            children += got
    src["frontend_logger"] = {"records": len(own)}
    src["child_processes"] = {"records_by_pid": kids,
                              "note": "engine-core/worker records reach the front end only when the plugin runs in "
                                      "those processes (installed entry point, or processes forked from this one)"}
    captured = [s for _, s in sorted(own + children, key=lambda x: x[0])]
    lines: list[str] = []
    for s in captured:
        lines += s.split("\n")
    lines = lines[-n:]
    used = "captured"
    fpath = os.environ.get(ENV_LOG)
    if fpath:
        p = Path(fpath)
        try:
            time.sleep(0.3)     # let the engine processes' last lines reach the file
            flines = _read_tail(p, n)
            src["file"] = {"path": str(p), "lines": len(flines), "status": "used" if flines else "empty"}
            if flines:
                lines, used = flines, "file"
        except OSError as e:
            src["file"] = {"path": str(p), "status": f"unreadable: {e.strerror or e}"}
    else:
        src["file"] = {"status": f"not set ({ENV_LOG})"}
    src["used"] = used
    if exc is not None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip("\n").split("\n")
        lines += tb
        src["exception"] = f"{type(exc).__name__} appended as Python prints it ({len(tb)} lines)"
    return lines, src


def workload_of(start: dict) -> dict:
    from oomdoctor.card.workload import DEFAULT_REQUESTS  # noqa: PLC0415

    explicit = dict(start.get("explicit") or {})
    args: dict[str, Any] = {}
    notes: list[str] = []
    not_plain = set(start.get("explicit_not_plain") or [])
    for k, v in explicit.items():
        if k == "model":
            continue
        if k in not_plain:
            notes.append(f"explicit argument {k} has no plain value ({str(v)[:80]}): retest cannot pass it back")
            continue
        args[k] = v
    for k, v in (start.get("applied") or {}).items():
        args[k] = v
    wl: dict[str, Any] = {
        "launcher": start.get("launcher", "vllm-llm"),
        "model": (start.get("model") or {}).get("path"),
        "engine_args": args,
        "explicit_args": sorted(k for k in explicit if k != "model"),
        "resolved": dict(start.get("resolved") or {}),
        "env": dict(start.get("env") or {}),
        "requests": dict(DEFAULT_REQUESTS),
        "baseline": None,
        "source": "oomdoctor vLLM plugin",
    }
    if start.get("argv"):
        from oomdoctor.redact import redact_argv  # noqa: PLC0415

        wl["argv"] = redact_argv([str(a) for a in start["argv"]])
    if start.get("free_bytes") is not None:
        wl["free_at_start_bytes"] = int(start["free_bytes"])
        wl["free_at_start_source"] = "NVML at create_engine_config (oomdoctor plugin), before the engine started"
    if start.get("total_bytes") is not None:
        wl["gpu_total_bytes"] = int(start["total_bytes"])
    if start.get("applied"):
        wl["profile"] = {"name": (start.get("profile") or {}).get("selected"), "applied": start["applied"]}
        notes.append("engine_args include the serving profile's substitutions, so retest re-runs the config that "
                     "failed without the plugin (OOMDOCTOR_* variables are not recorded)")
    if notes:
        wl["notes"] = notes
    return wl


def write_card(start: dict, exc: BaseException | None) -> Path:
    """Diagnose the captured log and write an ``oomdoctor.incident/v1`` card (+ the log beside it)."""
    from oomdoctor.card import store as cardmod  # noqa: PLC0415
    from oomdoctor.diagnose.classify import diagnose_file  # noqa: PLC0415
    from oomdoctor.card.build import build_card  # noqa: PLC0415
    inc = incidents_dir()
    inc.mkdir(parents=True, exist_ok=True)
    lines, sources = collect_log(start, exc)
    start["log_sources"] = sources
    wl = workload_of(start)
    header = [f"# oomdoctor plugin {start.get('oomdoctor_version')}: start {start['id']} ({wl['launcher']}) failed at "
              f"{(start.get('failure') or {}).get('stage')}; log from {sources['used']}",
              "# oomdoctor-record: " + json.dumps({"workload": _jsonable(wl)}, sort_keys=True)]
    if start.get("free_bytes") is not None:
        header.append("# nvml before start: " + json.dumps({"free": start["free_bytes"], "total": start.get("total_bytes")}))
    tmp = inc / f".plugin-{start['id']}.log"
    tmp.write_text("\n".join(header + lines) + "\n", encoding="utf-8")
    try:
        rules, rules_note = _ruleset()
        diag = diagnose_file(tmp, rules)
        dev = start.get("device") or {"status": "not_captured", "gpus": []}
        notes = ["written by the oomdoctor vLLM plugin at the failing start itself; device state is NVML's reading at "
                 "create_engine_config, before the engine started",
                 f"log source: {sources['used']} (see plugin.log_sources)"] + ([rules_note] if rules_note else [])
        card = build_card(tmp, diag, dev, notes)
        final = inc / f"{card['id']}.log"
        k = 1
        while final.exists() or (inc / f"{final.stem}.yaml").exists():
            k += 1
            final = inc / f"{card['id']}-{k}.log"
        os.replace(tmp, final)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    card["source"]["path"] = str(final)
    eng = card.get("engine") or {}
    card["engine"] = {**eng, "name": eng.get("name") or "vllm", "version": eng.get("version") or start["engine"]["version"]}
    card["plugin"] = _jsonable({k: v for k, v in start.items() if k not in ("t0", "log_from", "spool", "device")})
    path = final.with_suffix(".yaml")
    cardmod.save(card, path)
    return path


def _ruleset():
    """oomdoctor's rules; when another engine's folder does not load, the vLLM rules alone (a broken
    llama.cpp rule must not cost a vLLM incident its card)."""
    from oomdoctor.paths import rules_dir  # noqa: PLC0415
    from oomdoctor.diagnose.rules import default_rules, load_rules  # noqa: PLC0415

    try:
        return default_rules(), None
    except Exception as e:  # noqa: BLE001
        import shutil  # noqa: PLC0415
        import tempfile  # noqa: PLC0415

        d = Path(tempfile.mkdtemp(prefix="oomdoctor-rules-"))
        try:
            (d / "vllm").symlink_to(rules_dir() / "vllm", target_is_directory=True)
            return load_rules(d), f"the full rule set did not load ({e}); the vLLM rules alone were used"
        finally:
            shutil.rmtree(d, ignore_errors=True)


# ----------------------------------------------------------------------------- tests only
def _reset_for_tests() -> None:
    """Forget every hook and handler (tests import a fresh fake vLLM each time)."""
    with _LOCK:
        h = _S["handler"]
        if h is not None:
            logging.getLogger("vllm").removeHandler(h)
        _cleanup_spools()
        _S.update(registered=False, handler=None, pending={}, last=None, seq=0, log_from=0.0, start_hooks=False,
                  spools=[])
    for k in (ENV_SPOOL, ENV_OWNER):
        os.environ.pop(k, None)
