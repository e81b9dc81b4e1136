"""Which setting change explains which ledger difference: one function per cause, each checking the memory
arithmetic (predicted against measured) where both logs print the figures it needs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oomdoctor.analysis.compare.fmt import _significant, fmt_delta
from oomdoctor.analysis.compare.read import Start, _kv_bytes, _pin
from oomdoctor.analysis.compare.tables import DTYPE_BYTES, GiB, MiB
from oomdoctor.units import human_bytes

Explanation = dict[str, Any]     # cause, cause_kind, from, to, explains, status, arithmetic, and measured figures


def _expl(cause: str, cause_kind: str, a: Any, b: Any, explains: list[str], status: str, text: str,
          **kw: Any) -> Explanation:
    return {"cause": cause, "cause_kind": cause_kind, "from": a, "to": b, "explains": explains, "status": status,
            "arithmetic": text, **kw}


def _close(pred: float, meas: float, rel: float, abs_: float) -> bool:
    return abs(pred - meas) <= max(rel * abs(meas), abs_)


@dataclass
class Pair:
    """The two starts as explain's rules see them: settings values, ledgers, what is aligned."""
    A: Start
    B: Start
    aligned_ledger: set[str]
    aligned_settings: set[str]
    sa: dict[str, Any] = field(init=False)
    sb: dict[str, Any] = field(init=False)
    la: dict[str, Any] = field(init=False)
    lb: dict[str, Any] = field(init=False)
    pin_a: int | None = field(init=False)
    pin_b: int | None = field(init=False)
    total: Any = field(init=False)
    explained_kv: bool = False

    def __post_init__(self) -> None:
        self.sa = {k: v["value"] for k, v in self.A["settings"].items()}
        self.sb = {k: v["value"] for k, v in self.B["settings"].items()}
        self.la, self.lb = self.A["ledger"], self.B["ledger"]
        self.pin_a, self.pin_b = _pin(self.A["settings"]), _pin(self.B["settings"])
        self.total = self.la.get("gpu_total_bytes") or self.lb.get("gpu_total_bytes")

    def changed_setting(self, k: str) -> bool:
        sa, sb = self.sa, self.sb
        return k in self.aligned_settings and sa.get(k) != sb.get(k) and not (sa.get(k) is None and sb.get(k) is None)

    def both(self, k: str) -> bool:
        return k in self.aligned_ledger and self.la.get(k) is not None and self.lb.get(k) is not None


def _utilization(p: Pair) -> list[Explanation]:
    """gpu_memory_utilization → KV available (profiled starts)."""
    if not p.changed_setting("gpu_memory_utilization"):
        return []
    ua, ub = p.sa["gpu_memory_utilization"], p.sb["gpu_memory_utilization"]
    la, lb, total = p.la, p.lb, p.total
    if p.pin_a and p.pin_b:
        return [_expl("gpu_memory_utilization", "setting", ua, ub, [], "no_effect",
                      "the KV arena is pinned by kv_cache_memory_bytes on both starts: utilization does not size "
                      "the KV cache (vLLM: 'This does not respect the gpu_memory_utilization config'); it only "
                      "moves the start-up free-memory check")]
    if not (isinstance(ua, (int, float)) and isinstance(ub, (int, float)) and p.both("kv_available_bytes") and total):
        return [_expl("gpu_memory_utilization", "setting", ua, ub, [], "qualitative",
                      "utilization sizes the profiled KV budget (util × total − weights − activations); the "
                      "figures needed to check it are not in both logs")]
    ta = la.get("gpu_total_bytes") or total
    tb = lb.get("gpu_total_bytes") or total
    pred = ub * tb - ua * ta
    terms = f"({ub} − {ua}) × total {human_bytes(total)}"
    if p.both("weights_bytes") and la["weights_bytes"] != lb["weights_bytes"]:
        pred -= lb["weights_bytes"] - la["weights_bytes"]
        terms += " − Δweights"
    meas = lb["kv_available_bytes"] - la["kv_available_bytes"]
    ok = _close(pred, meas, 0.05, 512 * MiB)
    p.explained_kv = ok
    return [_expl("gpu_memory_utilization", "setting", ua, ub, ["kv_available_bytes"],
                  "explained" if ok else "partly",
                  f"gpu_memory_utilization {ua} → {ub} explains KV available "
                  f"{human_bytes(la['kv_available_bytes'])} → {human_bytes(lb['kv_available_bytes'])}: "
                  f"{terms} = {human_bytes(pred)} predicted, {human_bytes(meas)} measured (residual "
                  f"{human_bytes(meas - pred)}: activation/non-torch terms and the engine's rounding)",
                  predicted_bytes=int(pred), measured_bytes=int(meas), residual_bytes=int(meas - pred),
                  total_bytes=int(total))]


def _pinned_arena(p: Pair) -> list[Explanation]:
    """The pinned arena → reserved arena, KV tokens."""
    if not p.changed_setting("kv_cache_memory_bytes"):
        return []
    pin_a, pin_b, la, lb = p.pin_a, p.pin_b, p.la, p.lb
    p.explained_kv = True
    if not (pin_a and pin_b):
        return [_expl("kv_cache_memory_bytes", "setting", pin_a, pin_b,
                      [k for k in ("kv_cache_memory_bytes", "kv_available_bytes", "kv_cache_tokens") if
                       k in p.aligned_ledger and (la.get(k) is not None or lb.get(k) is not None)], "explained",
                      "one start pins the KV arena and the other profiles it: the pinned one reserves exactly "
                      "kv_cache_memory_bytes, the profiled one util × total − weights − activations")]
    exp = []
    parts = [f"kv_cache_memory_bytes {pin_a:,} → {pin_b:,} ({fmt_delta(pin_a, pin_b, 'bytes')})"]
    if p.both("kv_cache_memory_bytes"):
        exp.append("kv_cache_memory_bytes")
        parts.append(f"reserved arena {human_bytes(la['kv_cache_memory_bytes'])} → "
                     f"{human_bytes(lb['kv_cache_memory_bytes'])} as set")
    kw: dict[str, Any] = {}
    status = "explained"
    if p.both("kv_cache_tokens"):
        bpt = pin_a / la["kv_cache_tokens"]
        pred = pin_b / bpt
        ok = _close(pred, lb["kv_cache_tokens"], 0.01, 64)
        status = "explained" if ok else "partly"
        exp.append("kv_cache_tokens")
        parts.append(f"KV tokens {la['kv_cache_tokens']:,} → {lb['kv_cache_tokens']:,}: at {bpt:,.0f} B/token "
                     f"(proven arena / tokens) the new arena holds {pred:,.0f} tokens predicted, "
                     f"{lb['kv_cache_tokens']:,} measured")
        kw = {"predicted_tokens": int(round(pred)), "measured_tokens": lb["kv_cache_tokens"],
              "bytes_per_token": round(bpt)}
    return [_expl("kv_cache_memory_bytes", "setting", pin_a, pin_b, exp, status, "; ".join(parts), **kw)]


def _dtype_bytes(settings: dict[str, Any]) -> int:
    return DTYPE_BYTES.get(str(settings["kv_cache_dtype"])) or DTYPE_BYTES.get(str(settings.get("dtype")), None) or 2


def _kv_dtype(p: Pair) -> list[Explanation]:
    """KV dtype → bytes per token."""
    if not (p.changed_setting("kv_cache_dtype") and p.both("kv_bytes_per_token")):
        return []
    sa, sb, la, lb = p.sa, p.sb, p.la, p.lb
    da, db = _dtype_bytes(sa), _dtype_bytes(sb)
    pred = la["kv_bytes_per_token"] * db / da
    ok = _close(pred, lb["kv_bytes_per_token"], 0.05, 64)
    return [_expl("kv_cache_dtype", "setting", sa["kv_cache_dtype"], sb["kv_cache_dtype"],
                  ["kv_bytes_per_token", "kv_cache_tokens"], "explained" if ok else "partly",
                  f"kv_cache_dtype {sa['kv_cache_dtype']} → {sb['kv_cache_dtype']}: {da} → {db} byte(s) per "
                  f"element, {la['kv_bytes_per_token']:,} → {pred:,.0f} B/token predicted, "
                  f"{lb['kv_bytes_per_token']:,} measured")]


def _eager(p: Pair) -> list[Explanation]:
    """enforce_eager → CUDA graphs (and the init time)."""
    if not p.changed_setting("enforce_eager"):
        return []
    ea, eb = bool(p.sa["enforce_eager"]), bool(p.sb["enforce_eager"])
    ga, gb = p.la.get("cuda_graph_bytes"), p.lb.get("cuda_graph_bytes")
    exp = []
    txt = [f"enforce_eager {ea} → {eb}"]
    if "cuda_graph_bytes" in p.aligned_ledger and (ga is not None) != (gb is not None):
        eager_side_empty = (gb is None) if eb else (ga is None)
        if eager_side_empty:
            exp.append("cuda_graph_bytes")
            txt.append(f"explains the CUDA graph memory {human_bytes(ga) if ga else 'none'} → "
                       f"{human_bytes(gb) if gb else 'none'}: eager mode captures no CUDA graphs")
    if "engine_init_seconds" in p.aligned_ledger and p.both("engine_init_seconds"):
        exp.append("engine_init_seconds")
        txt.append(f"and the init time {p.la['engine_init_seconds']} → {p.lb['engine_init_seconds']} s "
                   "(no torch.compile, no capture)")
    return [_expl("enforce_eager", "setting", ea, eb, exp, "explained" if exp else "qualitative", " ".join(txt))]


def _batched_tokens(p: Pair) -> list[Explanation]:
    """max_num_batched_tokens → activation peak (→ profiled KV)."""
    if not p.changed_setting("max_num_batched_tokens"):
        return []
    ma, mb = p.sa["max_num_batched_tokens"], p.sb["max_num_batched_tokens"]
    la, lb = p.la, p.lb
    exp, txt = [], [f"max_num_batched_tokens {ma} → {mb}: the profiling pass runs a batch of that many tokens, "
                    "so it sizes the activation peak"]
    if p.both("activation_peak_bytes"):
        exp.append("activation_peak_bytes")
        txt.append(f"(activation peak {human_bytes(la['activation_peak_bytes'])} → "
                   f"{human_bytes(lb['activation_peak_bytes'])})")
    same_budget = (not p.changed_setting("gpu_memory_utilization") and not p.pin_a and not p.pin_b and
                   (not p.both("weights_bytes") or not _significant(la["weights_bytes"], lb["weights_bytes"], "bytes")))
    if same_budget and p.both("kv_available_bytes") and not p.explained_kv:
        dkv = lb["kv_available_bytes"] - la["kv_available_bytes"]
        exp.append("kv_available_bytes")
        how = ("inferred: the activation peak is not printed by this engine version"
               if not p.both("activation_peak_bytes") else "measured")
        txt.append(f"; with utilization, total and weights unchanged, KV available = util × total − weights − "
                   f"activation peak − non-torch, so the KV change "
                   f"{fmt_delta(la['kv_available_bytes'], lb['kv_available_bytes'], 'bytes')} "
                   f"is the activation/non-torch change with the opposite sign ({how})")
        p.explained_kv = True
        return [_expl("max_num_batched_tokens", "setting", ma, mb, exp, "inferred", " ".join(txt),
                      measured_bytes=int(dkv))]
    if p.pin_a and p.pin_b:
        txt.append("; the KV arena is pinned on both starts, so the KV size does not move with it — the "
                   "activation peak comes on top of the arena and moves the free memory the start needs")
    return [_expl("max_num_batched_tokens", "setting", ma, mb, exp, "qualitative" if not exp else "explained",
                  " ".join(txt))]


def _weights(p: Pair) -> list[Explanation]:
    """Quantization / dtype / parallelism / offload → the weights resident on each GPU."""
    out = []
    sa, sb, la, lb = p.sa, p.sb, p.la, p.lb
    for k in ("quantization", "dtype", "tensor_parallel_size", "pipeline_parallel_size", "cpu_offload_gb"):
        if not p.changed_setting(k):
            continue
        moved = p.both("weights_bytes") and _significant(la["weights_bytes"], lb["weights_bytes"], "bytes")
        exp = ["weights_bytes"] if moved else []
        txt = f"{k} {sa[k]} → {sb[k]} changes the weights resident on each GPU"
        if exp:
            txt += f": {human_bytes(la['weights_bytes'])} → {human_bytes(lb['weights_bytes'])}"
        if k == "cpu_offload_gb" and exp:
            pred = -(float(sb[k] or 0) - float(sa[k] or 0)) * GiB
            meas = lb["weights_bytes"] - la["weights_bytes"]
            txt += f" ({human_bytes(pred)} predicted, {human_bytes(meas)} measured)"
        out.append(_expl(k, "setting", sa[k], sb[k], exp, "explained" if exp else "qualitative", txt))
    return out


def _kv_tokens_chain(p: Pair, so_far: list[Explanation]) -> list[Explanation]:
    """Ledger chain: KV bytes → tokens (same bytes per token), unless a setting already explains the tokens."""
    la, lb = p.la, p.lb
    if not (p.both("kv_cache_tokens") and _significant(la["kv_cache_tokens"], lb["kv_cache_tokens"], "tokens")) or \
            any("kv_cache_tokens" in e["explains"] for e in so_far):
        return []
    kva, kvb = _kv_bytes(p.A["settings"], la), _kv_bytes(p.B["settings"], lb)
    profiled = not (p.pin_a or p.pin_b)
    if not (kva and kvb and "kv_bytes_per_token" in p.aligned_ledger and
            (not profiled or "kv_available_bytes" in p.aligned_ledger)):
        return []
    bpt = kva / la["kv_cache_tokens"]
    pred = kvb / bpt
    ok = _close(pred, lb["kv_cache_tokens"], 0.01, 64)
    cause = "kv_available_bytes" if profiled else "kv_cache_memory_bytes"
    return [_expl(cause, "ledger", kva, kvb, ["kv_cache_tokens"], "explained" if ok else "partly",
                  f"KV tokens {la['kv_cache_tokens']:,} → {lb['kv_cache_tokens']:,} follow the KV bytes "
                  f"{human_bytes(kva)} → {human_bytes(kvb)} at {bpt:,.0f} B/token: {pred:,.0f} predicted",
                  predicted_tokens=int(round(pred)), measured_tokens=lb["kv_cache_tokens"])]


def _concurrency(p: Pair) -> list[Explanation]:
    """Ledger chain: tokens and window → max concurrency."""
    la, lb = p.la, p.lb
    if not (p.both("max_concurrency") and _significant(la["max_concurrency"], lb["max_concurrency"], "ratio") and
            p.both("kv_cache_tokens")):
        return []
    mla, mlb = p.sa.get("max_model_len"), p.sb.get("max_model_len")
    if not (mla and mlb):
        return []
    pred = lb["kv_cache_tokens"] / mlb
    ok = _close(pred, lb["max_concurrency"], 0.01, 0.011)
    tokens_moved = la["kv_cache_tokens"] != lb["kv_cache_tokens"]
    causes = []
    if tokens_moved:
        causes.append(f"KV tokens {la['kv_cache_tokens']:,} → {lb['kv_cache_tokens']:,}")
    if mla != mlb:
        causes.append(f"window {mla:,} → {mlb:,}")
    return [_expl("max_model_len" if mla != mlb and not tokens_moved else "kv_cache_tokens",
                  "ledger" if tokens_moved else "setting",
                  la["max_concurrency"], lb["max_concurrency"], ["max_concurrency"],
                  "explained" if ok else "partly",
                  f"max concurrency {la['max_concurrency']}x → {lb['max_concurrency']}x = KV tokens / window: "
                  f"{lb['kv_cache_tokens']:,} / {mlb:,} = {pred:.2f}x ({' and '.join(causes) or 'rounding'})")]


def explain(A: Start, B: Start, aligned_ledger: set[str], aligned_settings: set[str]) -> list[Explanation]:
    from oomdoctor.analysis.compare.failure import explain_failure

    p = Pair(A, B, aligned_ledger, aligned_settings)
    out: list[Explanation] = []
    for rule in (_utilization, _pinned_arena, _kv_dtype, _eager, _batched_tokens, _weights):
        out += rule(p)
    out += _kv_tokens_chain(p, out)
    out += _concurrency(p)
    out += explain_failure(A, B, p.sa, p.sb, p.changed_setting, p.both)
    strong = {e["cause"] for e in out if e["status"] != "qualitative"}
    return [e for e in out if e["status"] != "qualitative" or e["cause"] not in strong]
