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
(schema ``oomdoctor.incident/v1``, built by :func:`oomdoctor.card.build.build_card` from the
captured log) into ``OOMDOCTOR_INCIDENTS`` (default ``./incidents``) whose workload
(``vllm-llm`` kwargs or ``vllm-serve`` flags) lets ``oomdoctor retest`` re-run exactly that launch.
Every start, passing or failing, is appended to ``<incidents>/starts.jsonl`` (``OOMDOCTOR_PLUGIN_STARTS``
= another path, or ``0`` for none).

The plugin never breaks a start: every error of its own is logged under ``vllm.oomdoctor`` and
swallowed; the engine's own result or exception passes through unchanged.

The parts: ``state`` (switches, lock, the start record), ``hooks`` (what is wrapped in vLLM), ``lifecycle``
(a start from its recording to its outcome), ``record`` (explicit arguments, model, GPUs, env), ``argv``
(flags of a ``vllm serve`` line), ``values`` (plain copies), ``profile`` (a measured profile applied),
``capture`` (the log handler and the children's spool), ``card`` (the incident card of a failed start).
Importing this package imports only the standard library: vLLM and the rest of oomdoctor load when used.
"""
from __future__ import annotations

import logging
import os
import sys

from oomdoctor.engines.vllm.plugin.argv import argv_fields
from oomdoctor.engines.vllm.plugin.capture import Capture, cleanup_spools, format_record, install_capture
from oomdoctor.engines.vllm.plugin.card import collect_log, incidents_dir, workload_of, write_card
from oomdoctor.engines.vllm.plugin.hooks import wrap_create_engine_config
from oomdoctor.engines.vllm.plugin.record import engine_gpus, explicit_args, model_info
from oomdoctor.engines.vllm.plugin.state import (ENV_ON, ENV_OWNER, ENV_SPOOL, LOCK, MARK, S, fresh_state, is_child,
                                                 own_error, truthy)

__all__ = ["MARK", "S", "Capture", "argv_fields", "collect_log", "enabled", "engine_gpus", "explicit_args",
           "format_record", "incidents_dir", "model_info", "register", "workload_of", "write_card"]


def enabled() -> bool:
    return truthy(os.environ.get(ENV_ON))


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point. Off unless OOMDOCTOR_PLUGIN=1; idempotent; never raises."""
    if not enabled():
        return
    try:
        with LOCK:
            install_capture()
            if S["registered"]:
                return
            if is_child() and "vllm.engine.arg_utils" not in sys.modules:
                return          # an engine core / worker: only the log capture (no config is built here)
            wrap_create_engine_config()
            S["registered"] = True
    except Exception:  # noqa: BLE001
        own_error("register")


def _reset_for_tests() -> None:
    """Forget every hook and handler (tests import a fresh fake vLLM each time)."""
    with LOCK:
        h = S["handler"]
        if h is not None:
            logging.getLogger("vllm").removeHandler(h)
        cleanup_spools()
        keep_atexit = S["atexit"]            # the atexit hook stays registered for the process
        S.update(fresh_state())
        S["atexit"] = keep_atexit
    for k in (ENV_SPOOL, ENV_OWNER):
        os.environ.pop(k, None)
