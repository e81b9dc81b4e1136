"""What a lever generator may read: the diagnosis's numbers, the workload, the device state, the attempts."""
from __future__ import annotations

import os
from typing import Any

from oomdoctor.card.records import Attempt, Workload
from oomdoctor.engines.vllm.defaults import default_utilization, utilization_assumed


#: outcomes of attempts that do not count as a tried lever (and whose change a retest never keeps)
NOT_TRIED = ("inconclusive", "interrupted", "error")


def counts_as_tried(attempt: Any) -> bool:
    """A lever is 'tried' only by an attempt that ran to a verdict on it."""
    return attempt.get("outcome") not in NOT_TRIED


class Ctx:
    """What a lever generator may read."""

    def __init__(self, klass: str, numbers: dict[str, Any], workload: Workload, device: dict[str, Any],
                 attempts: list[Attempt], version: str | None = None):
        self.klass = klass
        self.version = version          # the engine's version the log names (None: not named)
        self.n = numbers
        self.wl: Workload = workload or {}
        self.device = device or {}
        self.attempts: list[Attempt] = attempts or []
        self.args = dict(self.wl.get("engine_args") or {})
        self.resolved = dict(self.wl.get("resolved") or {})
        self.explicit = set(self.wl.get("explicit_args") or self.args.keys())

    def setting(self, key: str, default: Any = None) -> Any:
        if key in self.args:
            return self.args[key]
        if key in self.resolved:
            return self.resolved[key]
        return self.n.get(key, default)

    @property
    def pinned(self) -> int | None:
        v = self.args.get("kv_cache_memory_bytes") or self.n.get("kv_cache_memory_bytes_pinned")
        if v is None and "kv_cache_memory_bytes" in self.n and self.klass != "kv_capacity":
            v = self.n["kv_cache_memory_bytes"]
        try:
            return int(float(v)) if v is not None else None
        except (TypeError, ValueError):
            return None

    @property
    def _util_given(self) -> Any:
        """The utilization the user set or the log printed (None: neither)."""
        return self.args.get("gpu_memory_utilization", self.n.get("gpu_memory_utilization"))

    @property
    def util(self) -> float:
        """The utilization the engine ran with: the user's, the log's, else vLLM's default for the log's version."""
        v = self._util_given
        return float(v) if v is not None else default_utilization(self.version)

    @property
    def util_said(self) -> str:
        """``c.util`` as an arithmetic line writes it: a default guessed for want of a version says so."""
        if self._util_given is not None or not utilization_assumed(self.version):
            return f"{self.util}"
        return f"{self.util} (vLLM's default since 0.20; 0.9 before: the log names no version)"

    @property
    def total(self) -> int | None:
        for k in ("gpu_total_bytes",):
            if k in self.n:
                return int(self.n[k])
        if self.wl.get("gpu_total_bytes"):
            return int(self.wl["gpu_total_bytes"])
        return None

    @property
    def free(self) -> int | None:
        """Free memory at the start, as the engine saw it (its own check) or as recorded."""
        for k in ("free_at_start_bytes", "initial_free_bytes"):
            if k in self.n:
                return int(self.n[k])
        if self.wl.get("free_at_start_bytes"):
            return int(self.wl["free_at_start_bytes"])
        return None

    def other_holders(self) -> list[dict[str, Any]]:
        """Processes other than the engine that held GPU memory: from the log, then from NVML."""
        out = []
        if self.n.get("other_process_bytes"):
            out.append({"pid": self.n.get("other_process_pid"), "used_bytes": int(self.n["other_process_bytes"]),
                        "source": "the OOM message in the log"})
            return out
        if self.device.get("status") == "captured":
            idx = int(self.n.get("oom_gpu_index", 0))
            for g in self.device.get("gpus", []):
                if g.get("index") != idx:
                    continue
                for p in g.get("processes") or []:
                    if p.get("pid") == os.getpid() or not p.get("used_bytes"):
                        continue
                    name = p.get("name") or ""
                    leftover = any(k in name for k in ("vllm", "EngineCore", "sglang", "llama-server"))
                    out.append({"pid": p["pid"], "used_bytes": int(p["used_bytes"]), "name": name[:120],
                                "source": f"NVML now on this machine, GPU {idx}"
                                          + (" (looks like a leftover engine)" if leftover else "")})
        return out

    def tried(self, lever_id: str, change: dict[str, Any]) -> bool:
        """Tried = an attempt ran to a verdict on it (an inconclusive or interrupted one does not count)."""
        for a in self.attempts:
            if a.get("lever") == lever_id and a.get("change") == change and counts_as_tried(a):
                return True
        return False

