"""Runtime signals: KV pressure, preemption and rejections over a serving log.

vLLM V1 prints no line per preemption; its periodic stats line carries running/waiting
requests and KV usage (and, from 0.25 on, ``Preemptions: N`` when non-zero — a real 0.25.1
run with 15 preemptions by the Prometheus counter showed no such field). So the tracker:
- counts preemptions where a number exists (stats field, V0 warning, ``/metrics`` counter);
- otherwise infers KV pressure from the stats lines: KV usage near 100 % while requests wait;
- counts rejected requests (signal rules of class ``admission_rejection``).
Samples are kept for a timeline; past ``MAX_SAMPLES`` every other one is dropped, so the
memory used stays bounded on logs of any length.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

KV_PRESSURE_PERCENT = 95.0
PRESSURE_MIN_SAMPLES = 2
MAX_SAMPLES = 4096
PREEMPTION_LEVERS = ["kv_cache_memory_bytes", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "gpu_memory_utilization",
                     "max_model_len"]
REJECTION_LEVERS = ["admission_queue", "max_model_len", "max_num_seqs", "kv_cache_dtype"]

METRIC_RE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>[-+0-9.eE]+|NaN|\+Inf|-Inf)\s*(?:\d+)?$")


@dataclass
class Sample:
    line: int
    ts: str
    kv_usage_percent: float | None
    running: int | None
    waiting: int | None
    preemptions: int | None


class RuntimeTracker:
    """Folds signal matches as they stream by, in one bucket per (engine, rule versions), so that memory stays
    bounded on logs of any length; ``select`` keeps the buckets of the engine and version finally detected."""

    def __init__(self) -> None:
        self._buckets: dict[tuple, "RuntimeTracker"] = {}
        self.samples: list[Sample] = []
        self._stride = 1
        self._seen = 0
        self.preemption_events = 0          # from per-interval fields / warnings
        self.preemption_cumulative: int | None = None
        self.metrics: dict[str, float] = {}
        self.preemption_counter: str | None = None       # the engine's preemption counter, once --metrics is read
        self.rejections: list = []
        self.rejection_count = 0
        self.first_pressure: int | None = None
        self.pressure_samples = 0
        self.max_kv_usage: float | None = None
        self.max_waiting: int | None = None
        self.first_serving: tuple[int, str] | None = None   # the first line that shows the engine serving

    # -- collection -----------------------------------------------------------------
    def add(self, m) -> None:
        key = (m.rule.engine, m.rule.versions)
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = RuntimeTracker()
        b._fold(m)

    def select(self, keep: Callable[[str, str | None], bool]) -> None:
        """Merge the buckets whose (engine, versions) ``keep`` admits; drop the others."""
        chosen = [b for (eng, vers), b in self._buckets.items() if keep(eng, vers)]
        self._buckets = {}
        for b in chosen:
            self.preemption_events += b.preemption_events
            if b.preemption_cumulative is not None:
                self.preemption_cumulative = max(self.preemption_cumulative or 0, b.preemption_cumulative)
            self.rejection_count += b.rejection_count
            self.rejections = sorted(self.rejections + b.rejections, key=lambda r: r.n)[:20]
            self.pressure_samples += b.pressure_samples
            if b.first_pressure is not None:
                self.first_pressure = min(self.first_pressure or b.first_pressure, b.first_pressure)
            if b.max_kv_usage is not None:
                self.max_kv_usage = max(self.max_kv_usage or 0.0, b.max_kv_usage)
            if b.max_waiting is not None:
                self.max_waiting = max(self.max_waiting or 0, b.max_waiting)
            self._seen += b._seen
            if b.first_serving is not None and (self.first_serving is None or b.first_serving < self.first_serving):
                self.first_serving = b.first_serving
            self.samples = sorted(self.samples + b.samples, key=lambda x: x.line)
            self._stride = max(self._stride, b._stride)
        while len(self.samples) >= MAX_SAMPLES:
            self.samples = self.samples[::2]
            self._stride *= 2

    def _fold(self, m) -> None:
        # a serving line, a stats line or a rejected request: the engine was serving from this line on
        if self.first_serving is None or m.n < self.first_serving[0]:
            self.first_serving = (m.n, m.rule.title or m.rule.id)
        if m.rule.role == "serving":
            return
        nums = m.numbers
        klass = m.rule.klass
        if klass == "admission_rejection":
            self.rejection_count += 1
            if len(self.rejections) < 20:
                self.rejections.append(m)
            return
        if "preemptions_cumulative" in nums:
            self.preemption_cumulative = max(self.preemption_cumulative or 0, int(nums["preemptions_cumulative"]))
        if "preemptions" in nums:
            self.preemption_events += int(nums["preemptions"])
        if "kv_usage_percent" in nums or "running_reqs" in nums:
            s = Sample(m.n, m.line.ts, nums.get("kv_usage_percent"), nums.get("running_reqs"),
                       nums.get("waiting_reqs"), nums.get("preemptions"))
            self._sample(s)
        elif "preemptions" not in nums and "preemptions_cumulative" not in nums:
            self.preemption_events += 1          # a per-event warning without a count
            self.preemption_cumulative = max(self.preemption_cumulative or 0, self.preemption_events)

    def _sample(self, s: Sample) -> None:
        if s.kv_usage_percent is not None:
            self.max_kv_usage = max(self.max_kv_usage or 0.0, s.kv_usage_percent)
            if s.kv_usage_percent >= KV_PRESSURE_PERCENT and (s.waiting or 0) > 0:
                self.pressure_samples += 1
                if self.first_pressure is None:
                    self.first_pressure = s.line
        if s.waiting is not None:
            self.max_waiting = max(self.max_waiting or 0, s.waiting)
        self._seen += 1
        if (self._seen - 1) % self._stride:
            return
        self.samples.append(s)
        if len(self.samples) >= MAX_SAMPLES:
            self.samples = self.samples[::2]
            self._stride *= 2

    def add_metrics(self, text: str, preemption_counters: Sequence[str] = ()) -> None:
        """Read a Prometheus /metrics text: counters summed over their label sets. ``preemption_counters``: the
        engine's preemption counter names (its ``engine.yaml``), the first one present counts."""
        for raw in text.splitlines():
            raw = raw.strip()
            if not raw or raw.startswith("#"):
                continue
            m = METRIC_RE.match(raw)
            if not m:
                continue
            try:
                val = float(m.group("value"))
            except ValueError:
                continue
            self.metrics[m.group("name")] = self.metrics.get(m.group("name"), 0.0) + val
        for name in preemption_counters:
            if name in self.metrics:
                self.preemption_cumulative = max(self.preemption_cumulative or 0, int(self.metrics[name]))
                break
        if preemption_counters:
            self.preemption_counter = preemption_counters[0]

    # -- results --------------------------------------------------------------------
    @property
    def preemptions(self) -> int:
        return max(self.preemption_events, self.preemption_cumulative or 0)

    def classify(self) -> dict | None:
        if self.preemptions > 0:
            basis = "preemption counter" if self.preemption_cumulative else "preemption count in the log"
            if self.metrics and self.preemption_cumulative and self.preemption_counter:
                basis = f"Prometheus counter {self.preemption_counter} (--metrics)"
            return {"class": "kv_preemption", "rule": "runtime.preemption.counted", "basis": basis,
                    "levers": PREEMPTION_LEVERS,
                    "message": f"{self.preemptions} preemption(s): running requests were evicted and recomputed "
                               "for lack of KV cache blocks."}
        if self.pressure_samples >= PRESSURE_MIN_SAMPLES:
            return {"class": "kv_preemption", "rule": "runtime.kv_pressure.inferred",
                    "basis": f"inferred: {self.pressure_samples} stats line(s) with KV usage >= {KV_PRESSURE_PERCENT:g}% "
                             "while requests were waiting (no preemption counter in the log; pass --metrics)",
                    "levers": PREEMPTION_LEVERS,
                    "message": "KV cache saturated while requests waited: the scheduler was capped by KV blocks, "
                               "which preempts and recomputes running sequences."}
        if self.rejection_count:
            r = self.rejections[0]
            return {"class": "admission_rejection", "rule": r.rule.id, "basis": f"{self.rejection_count} rejected request(s)",
                    "levers": r.rule.levers or REJECTION_LEVERS, "message": r.rule.message}
        return None

    def numbers(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.preemptions:
            out["preemptions_count"] = self.preemptions
        if self.max_kv_usage is not None:
            out["kv_usage_max_percent"] = self.max_kv_usage
        if self.max_waiting is not None:
            out["waiting_max_requests"] = self.max_waiting
        if self.pressure_samples:
            out["kv_pressure_samples_count"] = self.pressure_samples
        if self.rejection_count:
            out["rejected_requests_count"] = self.rejection_count
        for r in self.rejections[:1]:
            out.update(r.numbers)
        return out

    def evidence(self) -> list[dict]:
        ev: list[dict] = []
        for r in self.rejections[:3]:
            ev.append({"line": r.n, "text": r.line.text[:2000], "rule": r.rule.id, "role": "root"})
        hot = [s for s in self.samples if s.kv_usage_percent is not None and s.kv_usage_percent >= KV_PRESSURE_PERCENT]
        for s in hot[:3]:
            ev.append({"line": s.line, "text": f"KV usage {s.kv_usage_percent:.1f}%, running {s.running}, waiting {s.waiting}",
                       "rule": "runtime.stats", "role": "root" if not ev else "related"})
        return ev

    def summary(self) -> dict:
        if not (self.samples or self.preemptions or self.rejection_count or self.metrics):
            return {}
        return {
            "stats_lines": self._seen,
            "preemptions": self.preemptions,
            "preemptions_source": ("metrics" if self.metrics and self.preemption_cumulative else
                                   "log" if self.preemptions else "none"),
            "kv_usage_max_percent": self.max_kv_usage,
            "waiting_max": self.max_waiting,
            "kv_pressure_samples": self.pressure_samples,
            "first_kv_pressure_line": self.first_pressure,
            "rejected_requests": self.rejection_count,
            "timeline": [{"line": s.line, "ts": s.ts, "kv_usage_percent": s.kv_usage_percent, "running": s.running,
                          "waiting": s.waiting, "preemptions": s.preemptions} for s in self.samples],
        }
