"""The log capture: a bounded handler on the ``vllm`` logger in vLLM's own line format; in the engine-core and
worker processes the same handler appends each record to the front end's spool folder."""
from __future__ import annotations

import collections
import functools
import json
import logging
import os
import time
import traceback

from oomdoctor.engines.vllm.plugin.state import ENV_SPOOL, MARK, S, SPOOL_CAP_BYTES, is_child, own_error, tail_n


class Capture(logging.Handler):
    """Keeps the last N records of this process (vLLM's line format); in a child of a front end that
    runs the plugin (engine core, workers) also appends them to the front end's spool folder."""

    def __init__(self, maxlen: int):
        super().__init__(level=logging.NOTSET)
        self.buf: collections.deque[tuple[float, str]] = collections.deque(maxlen=maxlen)
        self._dead: set[str] = set()
        self._started: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            child = is_child()
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


def _process_name(record: logging.LogRecord) -> str:
    name = getattr(record, "vllm_process_name", None)
    if name:
        return str(name)
    try:
        import multiprocessing  # noqa: PLC0415

        return multiprocessing.current_process().name
    except Exception:  # noqa: BLE001
        return "Process"


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
    prefix = f"({_process_name(record)} pid={record.process}) " if child else ""
    ts = time.strftime("%m-%d %H:%M:%S", time.localtime(record.created))
    head = f"{prefix}{record.levelname} {ts} [{record.filename}:{record.lineno}] "
    return "\n".join(head + ln for ln in msg.split("\n"))


def install_capture() -> None:
    if S["handler"] is None:
        S["handler"] = Capture(tail_n())
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
                    ensure_handler()

            setattr(_configure_vllm_root_logger, MARK, True)
            vlog._configure_vllm_root_logger = _configure_vllm_root_logger
    except Exception:  # noqa: BLE001
        own_error("attaching the log capture to vllm.logger")
    ensure_handler()


def ensure_handler() -> None:
    h = S["handler"]
    lg = logging.getLogger("vllm")
    if h is not None and h not in lg.handlers:
        lg.addHandler(h)


def remove_spool(spool: str | None) -> None:
    if not spool:
        return
    import shutil  # noqa: PLC0415

    shutil.rmtree(spool, ignore_errors=True)


def cleanup_spools() -> None:
    for s in list(S["spools"]):
        remove_spool(s)
