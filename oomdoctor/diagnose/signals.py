"""Runtime signals: KV pressure, preemption and rejections over a serving log.

vLLM V1 prints no line per preemption; its periodic stats line carries running/waiting
requests and KV usage (and, from 0.25 on, ``Preemptions: N`` when non-zero — a real 0.25.1
run with 15 preemptions by the Prometheus counter showed no such field). So the tracker:
- counts preemptions where a number exists (stats field, V0 warning, ``/metrics`` counter);
- otherwise infers KV pressure from the stats lines: KV usage near 100 % while requests wait;
- counts rejected requests (signal rules of class ``admission_rejection``).
Samples are kept for a timeline: the first stats line of every window of ``_win`` lines (windows aligned to the
line numbers; ``_win`` a power of two, doubled while the timeline would hold ``MAX_SAMPLES`` or more), so the
memory used stays bounded on logs of any length, and the timeline is the same whichever way the log is cut into
pieces (diagnose/parallel.py merges the pieces' timelines: ``merge_samples``).
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


class LazySample:
    """A timeline sample the matcher's fast path took: its line number now, its numbers when the timeline is read
    (``read()`` gives the Sample; most samples taken are thinned out again as the window widens)."""
    __slots__ = ("line", "read")

    def __init__(self, line: int, read: Callable[[], Sample]) -> None:
        self.line, self.read = line, read


class RuntimeTracker:
    """Folds signal matches as they stream by, in one bucket per (engine, rule versions), so that memory stays
    bounded on logs of any length; ``select`` keeps the buckets of the engine and version finally detected."""

    def __init__(self) -> None:
        self._buckets: dict[tuple, "RuntimeTracker"] = {}
        self.samples: list[Any] = []      # Sample or LazySample, in line order
        self._win = 1                       # the timeline's window, in lines (a power of two)
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
        self.bucket(m.rule)._fold(m)

    def select(self, keep: Callable[[str, str | None], bool]) -> None:
        """Merge the buckets whose (engine, versions) ``keep`` admits; drop the others."""
        chosen = [b for (eng, vers), b in self._buckets.items() if keep(eng, vers)]
        self._buckets = {}
        for b in chosen:
            self._merge(b)

    def absorb(self, other: "RuntimeTracker") -> None:
        """Another tracker's buckets into this one's, bucket by bucket: what one tracker over both trackers' lines
        would hold (the lines of the two are distinct: diagnose/parallel.py's pieces)."""
        for key, b in other._buckets.items():
            mine = self._buckets.get(key)
            if mine is None:
                self._buckets[key] = b
            else:
                mine._merge(b)

    def _merge(self, b: "RuntimeTracker") -> None:
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
        self.samples, self._win = merge_samples([(self.samples, self._win), (b.samples, b._win)])

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
                if self.first_pressure is None or s.line < self.first_pressure:
                    self.first_pressure = s.line
        if s.waiting is not None:
            self.max_waiting = max(self.max_waiting or 0, s.waiting)
        self._seen += 1
        if s.line >= self.next_window():
            self.keep_sample(s)

    def next_window(self) -> int:
        """The first line number the timeline takes a sample from next (stats lines come in line order): the start
        of the window after the last sample's."""
        return (self.samples[-1].line // self._win + 1) * self._win if self.samples else 0

    def timeline(self) -> list[Sample]:
        """The samples, every one read (LazySample)."""
        if any(isinstance(s, LazySample) for s in self.samples):
            self.samples = [s.read() if isinstance(s, LazySample) else s for s in self.samples]
        return self.samples

    def keep_sample(self, s: Sample | LazySample) -> None:
        """``s``: the first stats line of its window (``next_window`` <= s.line)."""
        self.samples.append(s)
        if len(self.samples) >= MAX_SAMPLES:
            self.samples, self._win = coarsen(self.samples, self._win)

    def bucket(self, rule) -> "RuntimeTracker":
        """The bucket signal matches of ``rule`` fold into (one per engine and rule versions)."""
        key = (rule.engine, rule.versions)
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = RuntimeTracker()
        return b

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
        if self.rejection_count:        # a refusal the clients saw outranks a saturation inferred from stats lines
            r = self.rejections[0]
            also = (f"; the KV cache was also saturated while requests waited ({self.pressure_samples} stats lines)"
                    if self.pressure_samples >= PRESSURE_MIN_SAMPLES else "")
            return {"class": "admission_rejection", "rule": r.rule.id,
                    "basis": f"{self.rejection_count} rejected request(s){also}",
                    "levers": r.rule.levers or REJECTION_LEVERS, "message": r.rule.message}
        if self.pressure_samples >= PRESSURE_MIN_SAMPLES:
            return {"class": "kv_preemption", "rule": "runtime.kv_pressure.inferred",
                    "basis": f"inferred: {self.pressure_samples} stats line(s) with KV usage >= {KV_PRESSURE_PERCENT:g}% "
                             "while requests were waiting (no preemption counter in the log; pass --metrics)",
                    "levers": PREEMPTION_LEVERS,
                    "message": "KV cache saturated while requests waited: the scheduler was capped by KV blocks, "
                               "which preempts and recomputes running sequences."}
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
        hot = [s for s in self.timeline() if s.kv_usage_percent is not None and s.kv_usage_percent >= KV_PRESSURE_PERCENT]
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
                          "waiting": s.waiting, "preemptions": s.preemptions} for s in self.timeline()],
        }


def first_per_window(samples: list[Sample], win: int) -> list[Sample]:
    """The first sample of every window of ``win`` lines (``samples`` in line order)."""
    out: list[Sample] = []
    last = -1
    for s in samples:
        w = s.line // win
        if w != last:
            out.append(s)
            last = w
    return out


def coarsen(samples: list[Sample], win: int) -> tuple[list[Sample], int]:
    """Double the window until fewer than MAX_SAMPLES windows hold a sample."""
    while len(samples) >= MAX_SAMPLES:
        win *= 2
        samples = first_per_window(samples, win)
    return samples, win


def merge_samples(parts: Sequence[tuple[list[Sample], int]]) -> tuple[list[Sample], int]:
    """One timeline of several (samples, window) timelines, each the first stats line per window of its lines:
    the same as one tracker would keep over all their lines. Each part's window is at most the merged one (a part
    has no more non-empty windows than the whole), and the first line of a coarse window is the first of one of
    its finer windows, so it is in the parts' samples."""
    win = max((w for _, w in parts), default=1)
    merged = sorted((s for ss, _ in parts for s in ss), key=lambda x: x.line)
    return coarsen(first_per_window(merged, win), win)


# ----------------------------------------------------------------------------- the shapes' bulk fold
_INT_UNITS = ("int", "tokens", "count")


class _Lazy:
    """The numbers ``name`` of the lines ``recs`` of one shape (the same spans), converted only when needed. The
    plan admits only plain numbers here (digits and one '.', one width for the whole shape): int()/float() of the
    bytes equal units.convert, and the largest number is the largest byte string."""

    def __init__(self, slot, recs: list[bytes], offset: int, name: str) -> None:
        x = next((x for x in slot.numbers if x.name == name), None)
        self.present = x is not None
        if x is not None:
            a, b = x.start + offset, x.end + offset
            self.conv = int if x.unit.lower() in _INT_UNITS else float
            self.raw = [r[a:b] for r in recs]

    def max(self) -> Any:
        return self.conv(max(self.raw))

    def values(self) -> list:
        return list(map(self.conv, self.raw))

    def as_bytes(self, value: float) -> bytes | None:
        """``value`` written as the shape writes its numbers (same digits before and after the '.'), when it is
        exactly that: then ``raw >= as_bytes(value)`` is ``conv(raw) >= value`` (one width, plain digits; at most
        12 decimals, far from float rounding); else None."""
        if not self.raw:
            return None
        head, dot, tail = self.raw[0].partition(b".")
        if len(tail) > 12 or (self.conv is int and dot):
            return None
        text = (f"{value:.{len(tail)}f}" if dot else f"{value:.0f}").zfill(len(self.raw[0])).encode()
        return text if len(text) == len(self.raw[0]) and float(text) == value else None


TRACKED_NUMBERS = ("preemptions_cumulative", "preemptions", "kv_usage_percent", "running_reqs", "waiting_reqs")


def _fold_rejections(b: RuntimeTracker, recs: list[bytes], offset: int, materialize: Callable, base: int) -> None:
    b.rejection_count += len(recs)
    first = int(recs[0][:offset - 1]) + base
    if len(b.rejections) >= 20 and max(r.n for r in b.rejections) < first:
        return
    new = [materialize(r) for r in recs[:20]]
    b.rejections = sorted(b.rejections + [m for m in new if m is not None], key=lambda m: m.n)[:20]


def _fold_stats(b: RuntimeTracker, kv: _Lazy, waiting: _Lazy, recs: list[bytes], offset: int, base: int) -> None:
    kv_max = kv.max() if kv.present else None
    w_max = waiting.max() if waiting.present else None
    if kv_max is not None:
        b.max_kv_usage = max(b.max_kv_usage or 0.0, kv_max)
    if w_max is not None:
        b.max_waiting = max(b.max_waiting or 0, w_max)
    if kv_max is None or kv_max < KV_PRESSURE_PERCENT or w_max is None or w_max <= 0:
        return
    at = kv.as_bytes(KV_PRESSURE_PERCENT)
    if at is not None and waiting.conv is int:          # compare the bytes: no conversion per line
        zero = b"0" * len(waiting.raw[0])
        hot = [i for i, (k, q) in enumerate(zip(kv.raw, waiting.raw)) if k >= at and q != zero]
    else:
        hot = [i for i, (k, q) in enumerate(zip(kv.values(), waiting.values())) if k >= KV_PRESSURE_PERCENT and q > 0]
    if hot:
        b.pressure_samples += len(hot)
        n = int(recs[hot[0]][:offset - 1]) + base
        if b.first_pressure is None or n < b.first_pressure:
            b.first_pressure = n


def fold_many(slot, recs: list[bytes], offset: int, materialize: Callable, base: int = 0) -> None:
    """Fold the lines ``recs`` (grep records ``N:line`` of one shape, ``offset`` bytes of prefix) into ``slot.bucket``
    as ``RuntimeTracker._fold`` would fold each one's match, except the timeline samples, which the matcher takes
    line by line (their order across shapes matters). ``materialize(rec)`` gives a record's full Match; ``base`` is
added to the records' line numbers."""
    b = slot.bucket
    if slot.rule.role == "serving":      # serving evidence: its first line (the shape's first, matched in full) is kept
        return
    if slot.rule.klass == "admission_rejection":
        _fold_rejections(b, recs, offset, materialize, base)
        return
    names = {x.name for x in slot.numbers}
    if "preemptions_cumulative" in names:
        cum = _Lazy(slot, recs, offset, "preemptions_cumulative").max()
        b.preemption_cumulative = max(b.preemption_cumulative or 0, int(cum))
    if "preemptions" in names:
        b.preemption_events += sum(int(v) for v in _Lazy(slot, recs, offset, "preemptions").values())
    if "kv_usage_percent" in names or "running_reqs" in names:
        _fold_stats(b, _Lazy(slot, recs, offset, "kv_usage_percent"), _Lazy(slot, recs, offset, "waiting_reqs"),
                    recs, offset, base)
    elif "preemptions" not in names and "preemptions_cumulative" not in names:
        b.preemption_events += len(recs)
        b.preemption_cumulative = max(b.preemption_cumulative or 0, b.preemption_events)


def samples_numbers(slot) -> bool:
    """Whether matches of this slot's rule give timeline samples (see ``RuntimeTracker._fold``)."""
    if slot.rule.klass == "admission_rejection":
        return False
    names = {x.name for x in slot.numbers}
    return "kv_usage_percent" in names or "running_reqs" in names
