"""Where the plugin attaches to vLLM: ``EngineArgs.create_engine_config`` (in the front end), then the engine
start (``LLMEngine.__init__``, ``AsyncLLM.__init__``, ``wait_for_engine_startup``). Every wrapper is marked
(installed once), looks its target up at call time, and lets the engine's result or exception through untouched."""
from __future__ import annotations

import functools
from typing import Any, Callable

from oomdoctor.engines.vllm.plugin import lifecycle
from oomdoctor.engines.vllm.plugin.state import LOCK, MARK, TLS, S, StartRecord, own_error


def wrap_create_engine_config() -> None:
    from vllm.engine.arg_utils import EngineArgs  # noqa: PLC0415 - vLLM is imported by whoever calls us

    orig = EngineArgs.__dict__.get("create_engine_config")
    if orig is None or getattr(orig, MARK, False):
        return

    @functools.wraps(orig)
    def create_engine_config(self, *args, **kwargs):
        if getattr(TLS, "depth", 0):             # a nested call (vLLM building a draft config): pass through
            return orig(self, *args, **kwargs)
        TLS.depth = 1
        try:
            start = None
            try:
                start = _before_config(self, args, kwargs)
            except Exception:  # noqa: BLE001
                own_error("recording the engine arguments")
            try:
                cfg = orig(self, *args, **kwargs)
            except Exception as exc:
                try:
                    if start is not None:
                        lifecycle.failed(start, exc, "config")
                except Exception:  # noqa: BLE001
                    own_error("writing the incident card")
                raise
            try:
                if start is not None:
                    lifecycle.after_config(start, cfg)
            except Exception:  # noqa: BLE001
                own_error("recording the resolved config")
            return cfg
        finally:
            TLS.depth = 0

    setattr(create_engine_config, MARK, True)
    EngineArgs.create_engine_config = create_engine_config


def _before_config(ea: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> StartRecord:
    """Open the start, hook the engine start it leads to, then measure it."""
    launch = lifecycle.open_start(ea, args, kwargs)
    install_start_hooks()
    return lifecycle.measure_start(ea, launch)


def install_start_hooks() -> None:
    with LOCK:
        if S["start_hooks"]:
            return
        S["start_hooks"] = True
    import importlib  # noqa: PLC0415

    for mod, cls in (("vllm.v1.engine.llm_engine", "LLMEngine"), ("vllm.v1.engine.async_llm", "AsyncLLM")):
        try:
            c = getattr(importlib.import_module(mod), cls)
            orig = c.__dict__.get("__init__")
            if orig is not None and not getattr(orig, MARK, False):
                w = _wrap_start(orig, f"{cls}.__init__")
                c.__init__ = w
        except Exception:  # noqa: BLE001
            own_error(f"hooking {mod}.{cls}.__init__")
    try:
        m = importlib.import_module("vllm.v1.engine.utils")
        orig = getattr(m, "wait_for_engine_startup", None)
        if orig is not None and not getattr(orig, MARK, False):
            setattr(m, "wait_for_engine_startup", _wrap_start(orig, "wait_for_engine_startup", is_init=False))
    except Exception:  # noqa: BLE001
        own_error("hooking vllm.v1.engine.utils.wait_for_engine_startup")


def _start_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> StartRecord | None:
    cfg = kwargs.get("vllm_config")
    if cfg is None:
        for a in args:
            if type(a).__name__ == "VllmConfig":
                cfg = a
                break
    with LOCK:
        if cfg is not None and id(cfg) in S["pending"]:
            return S["pending"][id(cfg)]
        last = S["last"]
        return last if last is not None and last.get("outcome") == "pending" else None


def _wrap_start(orig: Callable[..., Any], name: str, is_init: bool = True) -> Callable[..., Any]:
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        start = None
        try:
            start = _start_for(args[1:] if is_init else args, kwargs)
        except Exception:  # noqa: BLE001
            own_error(f"{name}: finding the recorded start")
        try:
            result = orig(*args, **kwargs)
        except Exception as exc:
            try:
                if start is not None and not getattr(exc, "_oomdoctor_recorded", False):
                    lifecycle.failed(start, exc, "engine_start", where=name)
            except Exception:  # noqa: BLE001
                own_error("writing the incident card")
            raise
        if is_init:
            try:
                if start is not None and start.get("outcome") == "pending":
                    lifecycle.started(start)
            except Exception:  # noqa: BLE001
                own_error("recording the passing start")
        return result

    setattr(wrapper, MARK, True)
    return wrapper
