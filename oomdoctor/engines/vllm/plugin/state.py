"""What every part of the plugin shares: its environment switches, its logger, its lock, its per-process state
and the record of one engine start (the dict that becomes a line of ``starts.jsonl`` and the card's ``plugin``)."""
from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from oomdoctor.engines.vllm.plugin.capture import Capture

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

log = logging.getLogger("vllm.oomdoctor")
LOCK = threading.RLock()
TLS = threading.local()


class StartRecord(TypedDict, total=False):
    """One engine start as the plugin records it (keys in the order ``starts.jsonl`` writes them)."""
    id: str
    pid: int
    at: str
    t0: float
    log_from: float
    oomdoctor_version: str
    engine: dict[str, Any]
    usage_context: str | None
    launcher: str
    engine_args_class: str
    model: dict[str, Any]
    explicit: dict[str, Any]
    explicit_names: list[str]
    explicit_not_plain: list[str]
    defaults_source: str
    defaults: dict[str, Any]
    left_at_default: list[str]
    device: dict[str, Any]
    engine_gpus: list[int]
    free_bytes: int | None
    total_bytes: int | None
    argv: list[str] | None
    env: dict[str, str]
    spool: str
    outcome: str
    log: dict[str, Any]
    profile: dict[str, Any] | None
    applied: dict[str, Any]
    resolved: dict[str, Any]
    started_after_s: float
    failure: dict[str, Any]
    card: str
    log_sources: dict[str, Any]


class PluginState(TypedDict):
    registered: bool
    handler: Capture | None
    pending: dict[int, StartRecord]     # id(VllmConfig) -> its start, until the engine is up or failed
    last: StartRecord | None
    seq: int
    log_from: float
    start_hooks: bool
    spools: list[str]
    atexit: bool


def fresh_state() -> PluginState:
    return {"registered": False, "handler": None, "pending": {}, "last": None, "seq": 0, "log_from": 0.0,
            "start_hooks": False, "spools": [], "atexit": False}


S: PluginState = fresh_state()


def truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def own_error(where: str) -> None:
    """An error of the plugin itself: one warning under vLLM's logger, never raised."""
    try:
        e = sys.exc_info()[1]
        log.warning("oomdoctor plugin: internal error in %s (ignored; the engine is not affected): %s: %s",
                    where, type(e).__name__, e)
        log.debug("oomdoctor plugin: traceback of the internal error", exc_info=True)
    except Exception:  # noqa: BLE001
        pass


def is_child() -> bool:
    """A process started by a front end that runs the plugin (engine core, workers)."""
    owner = os.environ.get(ENV_OWNER)
    return bool(os.environ.get(ENV_SPOOL) and owner and owner != str(os.getpid()))


def tail_n() -> int:
    try:
        return max(50, int(os.environ.get(ENV_TAIL, DEFAULT_TAIL)))
    except ValueError:
        return DEFAULT_TAIL
