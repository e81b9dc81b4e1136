"""Compare two start-ups of the same model row by row — the proven one and the failing one — instead of
trusting a comment (../shared/INCIDENTS.md, incident 3).

``compare(proven_log, failing_log)`` diagnoses both logs and lines up:

- settings: window, max_num_seqs, max_num_batched_tokens, kv_cache_dtype, gpu_memory_utilization, the pinned
  kv_cache_memory_bytes, TP/PP, cpu offload, enforce_eager, quantization, dtype — from the explicit args line
  (``non-default args``) and the resolved config line (:func:`oomdoctor.card.workload.from_log`); a setting on
  neither line is a default (its value is shown only where the engine version's default is known);
- the ledger: free memory before the start, weights, activation peak and non-torch memory (where printed),
  CUDA graph memory, KV available / the pinned arena, KV tokens, KV bytes per token (derived), max
  concurrency, engine init seconds — from the diagnoses' numbers;

then says what changed, by how much, and which setting change the memory arithmetic says explains each
ledger difference (with the predicted and the measured figure). Two logs of different engine versions get a
warning and only the version-stable rows are compared.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from oomdoctor.errors import BadInput
from oomdoctor.units import human_bytes

GiB = 1 << 30
MiB = 1 << 20

# (name, label, kind, aligned across engine versions)
SETTINGS: list[tuple[str, str]] = [
    ("max_model_len", "window (max_model_len)"),
    ("max_num_seqs", "max_num_seqs"),
    ("max_num_batched_tokens", "max_num_batched_tokens"),
    ("kv_cache_dtype", "kv_cache_dtype"),
    ("gpu_memory_utilization", "gpu_memory_utilization"),
    ("kv_cache_memory_bytes", "pinned KV arena (kv_cache_memory_bytes)"),
    ("tensor_parallel_size", "tensor_parallel_size"),
    ("pipeline_parallel_size", "pipeline_parallel_size"),
    ("cpu_offload_gb", "cpu_offload_gb"),
    ("enforce_eager", "enforce_eager"),
    ("quantization", "quantization"),
    ("dtype", "dtype"),
]
LEDGER: list[tuple[str, str, str, bool]] = [
    ("free_before_start_bytes", "free before the start (NVML, capture header)", "bytes", True),
    ("engine_free_at_start_bytes", "free at start (engine's figure)", "bytes", False),
    ("gpu_total_bytes", "GPU total", "bytes", True),
    ("weights_bytes", "weights (model loading)", "bytes", True),
    ("activation_peak_bytes", "activation peak", "bytes", False),
    ("non_torch_bytes", "non-torch memory", "bytes", False),
    ("cuda_graph_bytes", "CUDA graph memory", "bytes", False),
    ("kv_available_bytes", "KV available (profiled budget)", "bytes", False),
    ("kv_cache_memory_bytes", "KV arena reserved (pinned)", "bytes", True),
    ("kv_cache_tokens", "KV tokens", "tokens", True),
    ("kv_bytes_per_token", "KV bytes per token (derived)", "bytes", True),
    ("max_concurrency", "max concurrency (x window)", "ratio", True),
    ("engine_init_seconds", "engine init", "seconds", False),
]
CONDITIONS = {"free_before_start_bytes", "gpu_total_bytes"}   # start conditions, not results of the settings
TIMINGS = {"engine_init_seconds"}
# defaults known per engine version range (value, versions, where it comes from)
KNOWN_DEFAULTS: dict[str, tuple[Any, str, str]] = {
    "gpu_memory_utilization": (0.92, ">=0.25,<0.34", "vLLM 0.25–0.33 CacheConfig default"),
    "kv_cache_memory_bytes": (None, ">=0.8", "not pinned"),
    "enforce_eager": (False, ">=0.8", "vLLM default"),
    "cpu_offload_gb": (0, ">=0.8", "vLLM default"),
    "kv_cache_dtype": ("auto", ">=0.8", "vLLM default"),
    "tensor_parallel_size": (1, ">=0.8", "vLLM default"),
    "pipeline_parallel_size": (1, ">=0.8", "vLLM default"),
    "quantization": (None, ">=0.8", "vLLM default"),
}
DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "int8": 1}


# ----------------------------------------------------------------------------- reading one start
def _num(v: Any) -> Any:
    from oomdoctor.card.fingerprint import normalize_value

    return normalize_value(v)


def _version_in(v: str | None, spec: str) -> bool:
    from oomdoctor.diagnose.rules import version_in

    if not v:
        return False
    try:
        return version_in(v, spec)
    except ValueError:
        return False


def read_start(path: str | Path, engine: str | None = None, engine_version: str | None = None) -> dict:
    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.diagnose.rules import default_rules
    from oomdoctor.card.workload import from_log

    d = diagnose_file(path, default_rules(), engine=engine, engine_version=engine_version)
    wl = from_log(path, d.matches, d.engine)
    n = dict(d.numbers)
    explicit = {k: v for k, v in (wl.get("engine_args") or {}).items()}
    resolved = dict(wl.get("resolved") or {})
    settings: dict[str, dict] = {}
    for key, _ in SETTINGS:
        if key in explicit:
            settings[key] = {"value": _num(explicit[key]), "source": "explicit"}
        elif key in resolved:
            settings[key] = {"value": _num(resolved[key]), "source": "resolved"}
        elif key in n and key in ("max_model_len", "max_num_batched_tokens"):
            settings[key] = {"value": n[key], "source": "resolved"}
        elif key in KNOWN_DEFAULTS and _version_in(d.engine_version, KNOWN_DEFAULTS[key][1]):
            val, _, why = KNOWN_DEFAULTS[key]
            settings[key] = {"value": val, "source": "default", "note": why, "known": True}
        else:
            settings[key] = {"value": None, "source": "default", "note": "default (value not printed)"}
    if settings["kv_cache_memory_bytes"]["value"] is None and n.get("kv_cache_memory_bytes") and \
            any(m.rule.id.endswith("kv_pinned") for m in d.matches):
        settings["kv_cache_memory_bytes"] = {"value": n["kv_cache_memory_bytes"], "source": "resolved",
                                             "note": "the engine's 'reserved ... as specified by kv_cache_memory_bytes' line"}
    ledger: dict[str, Any] = {
        "free_before_start_bytes": wl.get("free_at_start_bytes"),
        "engine_free_at_start_bytes": n.get("free_at_start_bytes") or n.get("initial_free_bytes"),
        "gpu_total_bytes": wl.get("gpu_total_bytes") or n.get("gpu_total_bytes"),
        "weights_bytes": n.get("weights_bytes"),
        "activation_peak_bytes": n.get("activation_peak_bytes"),
        "non_torch_bytes": n.get("non_torch_bytes"),
        "cuda_graph_bytes": n.get("cuda_graph_bytes") or n.get("cuda_graph_actual_bytes"),
        "kv_available_bytes": n.get("kv_available_bytes"),
        "kv_cache_memory_bytes": n.get("kv_cache_memory_bytes"),
        "kv_cache_tokens": n.get("kv_cache_tokens"),
        "max_concurrency": n.get("max_concurrency"),
        "engine_init_seconds": n.get("engine_init_seconds"),
    }
    kv_bytes = _kv_bytes(settings, ledger)
    if kv_bytes and ledger["kv_cache_tokens"]:
        ledger["kv_bytes_per_token"] = round(kv_bytes / ledger["kv_cache_tokens"])
    else:
        ledger["kv_bytes_per_token"] = None
    totals = {"nvml": wl.get("gpu_total_bytes"), "engine": n.get("gpu_total_bytes")}
    return {"totals": totals, "launcher": wl.get("launcher"), "path": str(path), "engine": d.engine, "engine_version": d.engine_version, "class": d.klass,
            "rule": d.rule, "phase_reached": d.phase_reached, "model": wl.get("model"),
            "decisive": ({"line": d.root.n, "text": d.root.line.text[:300]} if d.root is not None else None),
            "settings": settings, "ledger": ledger, "numbers": n, "notes": list(d.notes)}


def _pin(s: dict) -> int | None:
    v = s["kv_cache_memory_bytes"]["value"]
    return int(v) if isinstance(v, (int, float)) and v else None


def _kv_bytes(settings: dict, ledger: dict) -> int | None:
    """The bytes the KV cache was sized from: the exact pin, else the printed arena, else KV available."""
    return _pin(settings) or ledger.get("kv_cache_memory_bytes") or ledger.get("kv_available_bytes")


# ----------------------------------------------------------------------------- formatting
def fmt_value(v: Any, kind: str = "") -> str:
    if v is None:
        return "—"
    if kind == "bytes" and isinstance(v, (int, float)):
        return f"{human_bytes(v)} ({int(v):,} B)"
    if kind == "tokens" and isinstance(v, (int, float)):
        return f"{int(v):,}"
    if kind == "ratio":
        return f"{v}x"
    if kind == "seconds":
        return f"{v} s"
    return str(v)


def fmt_delta(a: Any, b: Any, kind: str) -> str:
    if a is None and b is None:
        return ""
    if a is None or b is None:
        return "only in " + ("failing" if a is None else "proven")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or isinstance(a, bool):
        return "changed" if a != b else ""
    d = b - a
    if d == 0:
        return ""
    pct = f" ({d / a * 100:+.1f}%)" if a else ""
    if kind == "bytes":
        return f"{'+' if d > 0 else '-'}{human_bytes(abs(d))} ({d:+,} B){pct}"
    if kind == "tokens":
        return f"{d:+,}{pct}"
    return f"{d:+.4g}{pct}"


def _significant(a: Any, b: Any, kind: str) -> bool:
    if a is None or b is None:
        return a is not b
    if not isinstance(a, (int, float)) or isinstance(a, bool):
        return a != b
    d = abs(b - a)
    if kind == "bytes":
        return d > max(32 * MiB, 0.005 * max(abs(a), abs(b)))      # the engine prints GiB with 2 decimals
    if kind == "tokens":
        return d > 0
    if kind == "ratio":
        return d > 0.011
    if kind == "seconds":
        return d > 0.1 * max(a, b)
    return d != 0


# ----------------------------------------------------------------------------- explaining
def _expl(cause: str, cause_kind: str, a: Any, b: Any, explains: list[str], status: str, text: str, **kw) -> dict:
    return {"cause": cause, "cause_kind": cause_kind, "from": a, "to": b, "explains": explains, "status": status,
            "arithmetic": text, **kw}


def _close(pred: float, meas: float, rel: float, abs_: float) -> bool:
    return abs(pred - meas) <= max(rel * abs(meas), abs_)


def explain(A: dict, B: dict, aligned_ledger: set[str], aligned_settings: set[str]) -> list[dict]:
    sa = {k: v["value"] for k, v in A["settings"].items()}
    sb = {k: v["value"] for k, v in B["settings"].items()}
    la, lb = A["ledger"], B["ledger"]
    out: list[dict] = []

    def changed_setting(k: str) -> bool:
        return k in aligned_settings and sa.get(k) != sb.get(k) and not (sa.get(k) is None and sb.get(k) is None)

    def both(k: str) -> bool:
        return k in aligned_ledger and la.get(k) is not None and lb.get(k) is not None

    pin_a, pin_b = _pin(A["settings"]), _pin(B["settings"])
    total = la.get("gpu_total_bytes") or lb.get("gpu_total_bytes")
    explained_kv = False

    # -- gpu_memory_utilization → KV available (profiled starts)
    if changed_setting("gpu_memory_utilization"):
        ua, ub = sa["gpu_memory_utilization"], sb["gpu_memory_utilization"]
        if pin_a and pin_b:
            out.append(_expl("gpu_memory_utilization", "setting", ua, ub, [], "no_effect",
                             "the KV arena is pinned by kv_cache_memory_bytes on both starts: utilization does not size "
                             "the KV cache (vLLM: 'This does not respect the gpu_memory_utilization config'); it only "
                             "moves the start-up free-memory check"))
        elif isinstance(ua, (int, float)) and isinstance(ub, (int, float)) and both("kv_available_bytes") and total:
            ta = la.get("gpu_total_bytes") or total
            tb = lb.get("gpu_total_bytes") or total
            pred = ub * tb - ua * ta
            terms = f"({ub} − {ua}) × total {human_bytes(total)}"
            if both("weights_bytes") and la["weights_bytes"] != lb["weights_bytes"]:
                pred -= lb["weights_bytes"] - la["weights_bytes"]
                terms += " − Δweights"
            meas = lb["kv_available_bytes"] - la["kv_available_bytes"]
            ok = _close(pred, meas, 0.05, 512 * MiB)
            out.append(_expl("gpu_memory_utilization", "setting", ua, ub, ["kv_available_bytes"],
                             "explained" if ok else "partly",
                             f"gpu_memory_utilization {ua} → {ub} explains KV available "
                             f"{human_bytes(la['kv_available_bytes'])} → {human_bytes(lb['kv_available_bytes'])}: "
                             f"{terms} = {human_bytes(pred)} predicted, {human_bytes(meas)} measured (residual "
                             f"{human_bytes(meas - pred)}: activation/non-torch terms and the engine's rounding)",
                             predicted_bytes=int(pred), measured_bytes=int(meas), residual_bytes=int(meas - pred),
                             total_bytes=int(total)))
            explained_kv = ok
        else:
            out.append(_expl("gpu_memory_utilization", "setting", ua, ub, [], "qualitative",
                             "utilization sizes the profiled KV budget (util × total − weights − activations); the "
                             "figures needed to check it are not in both logs"))

    # -- the pinned arena → reserved arena, KV tokens
    if changed_setting("kv_cache_memory_bytes"):
        if pin_a and pin_b:
            exp = []
            parts = [f"kv_cache_memory_bytes {pin_a:,} → {pin_b:,} ({fmt_delta(pin_a, pin_b, 'bytes')})"]
            if both("kv_cache_memory_bytes"):
                exp.append("kv_cache_memory_bytes")
                parts.append(f"reserved arena {human_bytes(la['kv_cache_memory_bytes'])} → "
                             f"{human_bytes(lb['kv_cache_memory_bytes'])} as set")
            kw: dict[str, Any] = {}
            status = "explained"
            if both("kv_cache_tokens"):
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
            out.append(_expl("kv_cache_memory_bytes", "setting", pin_a, pin_b, exp, status, "; ".join(parts), **kw))
            explained_kv = True
        else:
            out.append(_expl("kv_cache_memory_bytes", "setting", pin_a, pin_b,
                             [k for k in ("kv_cache_memory_bytes", "kv_available_bytes", "kv_cache_tokens") if
                              k in aligned_ledger and (la.get(k) is not None or lb.get(k) is not None)], "explained",
                             "one start pins the KV arena and the other profiles it: the pinned one reserves exactly "
                             "kv_cache_memory_bytes, the profiled one util × total − weights − activations"))
            explained_kv = True

    # -- KV dtype → bytes per token
    if changed_setting("kv_cache_dtype") and both("kv_bytes_per_token"):
        da = DTYPE_BYTES.get(str(sa["kv_cache_dtype"])) or DTYPE_BYTES.get(str(sa.get("dtype")), None) or 2
        db = DTYPE_BYTES.get(str(sb["kv_cache_dtype"])) or DTYPE_BYTES.get(str(sb.get("dtype")), None) or 2
        pred = la["kv_bytes_per_token"] * db / da
        ok = _close(pred, lb["kv_bytes_per_token"], 0.05, 64)
        out.append(_expl("kv_cache_dtype", "setting", sa["kv_cache_dtype"], sb["kv_cache_dtype"],
                         ["kv_bytes_per_token", "kv_cache_tokens"], "explained" if ok else "partly",
                         f"kv_cache_dtype {sa['kv_cache_dtype']} → {sb['kv_cache_dtype']}: {da} → {db} byte(s) per "
                         f"element, {la['kv_bytes_per_token']:,} → {pred:,.0f} B/token predicted, "
                         f"{lb['kv_bytes_per_token']:,} measured"))

    # -- enforce_eager → CUDA graphs
    if changed_setting("enforce_eager"):
        ea, eb = bool(sa["enforce_eager"]), bool(sb["enforce_eager"])
        ga, gb = la.get("cuda_graph_bytes"), lb.get("cuda_graph_bytes")
        exp = []
        txt = [f"enforce_eager {ea} → {eb}"]
        if "cuda_graph_bytes" in aligned_ledger and (ga is not None) != (gb is not None):
            eager_side_empty = (gb is None) if eb else (ga is None)
            if eager_side_empty:
                exp.append("cuda_graph_bytes")
                txt.append(f"explains the CUDA graph memory {human_bytes(ga) if ga else 'none'} → "
                           f"{human_bytes(gb) if gb else 'none'}: eager mode captures no CUDA graphs")
        if "engine_init_seconds" in aligned_ledger and both("engine_init_seconds"):
            exp.append("engine_init_seconds")
            txt.append(f"and the init time {la['engine_init_seconds']} → {lb['engine_init_seconds']} s "
                       "(no torch.compile, no capture)")
        out.append(_expl("enforce_eager", "setting", ea, eb, exp, "explained" if exp else "qualitative", " ".join(txt)))

    # -- max_num_batched_tokens → activation peak (→ profiled KV)
    if changed_setting("max_num_batched_tokens"):
        ma, mb = sa["max_num_batched_tokens"], sb["max_num_batched_tokens"]
        exp, txt = [], [f"max_num_batched_tokens {ma} → {mb}: the profiling pass runs a batch of that many tokens, "
                        "so it sizes the activation peak"]
        if both("activation_peak_bytes"):
            exp.append("activation_peak_bytes")
            txt.append(f"(activation peak {human_bytes(la['activation_peak_bytes'])} → "
                       f"{human_bytes(lb['activation_peak_bytes'])})")
        same_budget = (not changed_setting("gpu_memory_utilization") and not pin_a and not pin_b and
                       (not both("weights_bytes") or not _significant(la["weights_bytes"], lb["weights_bytes"], "bytes")))
        if same_budget and both("kv_available_bytes") and not explained_kv:
            dkv = lb["kv_available_bytes"] - la["kv_available_bytes"]
            exp.append("kv_available_bytes")
            txt.append(f"; with utilization, total and weights unchanged, KV available = util × total − weights − "
                       f"activation peak − non-torch, so the KV change {fmt_delta(la['kv_available_bytes'], lb['kv_available_bytes'], 'bytes')} "
                       f"is the activation/non-torch change with the opposite sign "
                       f"({'inferred: the activation peak is not printed by this engine version' if not both('activation_peak_bytes') else 'measured'})")
            explained_kv = True
            out.append(_expl("max_num_batched_tokens", "setting", ma, mb, exp, "inferred", " ".join(txt),
                             measured_bytes=int(dkv)))
        else:
            if pin_a and pin_b:
                txt.append("; the KV arena is pinned on both starts, so the KV size does not move with it — the "
                           "activation peak comes on top of the arena and moves the free memory the start needs")
            out.append(_expl("max_num_batched_tokens", "setting", ma, mb, exp, "qualitative" if not exp else "explained",
                             " ".join(txt)))

    # -- weights: quantization / dtype / parallelism / offload
    for k in ("quantization", "dtype", "tensor_parallel_size", "pipeline_parallel_size", "cpu_offload_gb"):
        if changed_setting(k):
            exp = ["weights_bytes"] if both("weights_bytes") and _significant(la["weights_bytes"], lb["weights_bytes"], "bytes") else []
            txt = f"{k} {sa[k]} → {sb[k]} changes the weights resident on each GPU"
            if exp:
                txt += f": {human_bytes(la['weights_bytes'])} → {human_bytes(lb['weights_bytes'])}"
            if k == "cpu_offload_gb" and exp:
                pred = -(float(sb[k] or 0) - float(sa[k] or 0)) * GiB
                meas = lb["weights_bytes"] - la["weights_bytes"]
                txt += f" ({human_bytes(pred)} predicted, {human_bytes(meas)} measured)"
            out.append(_expl(k, "setting", sa[k], sb[k], exp, "explained" if exp else "qualitative", txt))

    # -- ledger chains: KV bytes → tokens (same bytes per token); tokens and window → concurrency
    if both("kv_cache_tokens") and _significant(la["kv_cache_tokens"], lb["kv_cache_tokens"], "tokens") and \
            not any("kv_cache_tokens" in e["explains"] for e in out):
        kva, kvb = _kv_bytes(A["settings"], la), _kv_bytes(B["settings"], lb)
        profiled = not (pin_a or pin_b)
        if kva and kvb and "kv_bytes_per_token" in aligned_ledger and (not profiled or "kv_available_bytes" in aligned_ledger):
            bpt = kva / la["kv_cache_tokens"]
            pred = kvb / bpt
            ok = _close(pred, lb["kv_cache_tokens"], 0.01, 64)
            cause = "kv_available_bytes" if not (pin_a or pin_b) else "kv_cache_memory_bytes"
            out.append(_expl(cause, "ledger", kva, kvb, ["kv_cache_tokens"], "explained" if ok else "partly",
                             f"KV tokens {la['kv_cache_tokens']:,} → {lb['kv_cache_tokens']:,} follow the KV bytes "
                             f"{human_bytes(kva)} → {human_bytes(kvb)} at {bpt:,.0f} B/token: {pred:,.0f} predicted",
                             predicted_tokens=int(round(pred)), measured_tokens=lb["kv_cache_tokens"]))
    if both("max_concurrency") and _significant(la["max_concurrency"], lb["max_concurrency"], "ratio") and \
            both("kv_cache_tokens"):
        mla, mlb = sa.get("max_model_len"), sb.get("max_model_len")
        if mla and mlb:
            pred = lb["kv_cache_tokens"] / mlb
            ok = _close(pred, lb["max_concurrency"], 0.01, 0.011)
            causes = []
            if la["kv_cache_tokens"] != lb["kv_cache_tokens"]:
                causes.append(f"KV tokens {la['kv_cache_tokens']:,} → {lb['kv_cache_tokens']:,}")
            if mla != mlb:
                causes.append(f"window {mla:,} → {mlb:,}")
            out.append(_expl("max_model_len" if mla != mlb and la["kv_cache_tokens"] == lb["kv_cache_tokens"]
                             else "kv_cache_tokens", "ledger" if la["kv_cache_tokens"] != lb["kv_cache_tokens"] else "setting",
                             la["max_concurrency"], lb["max_concurrency"], ["max_concurrency"],
                             "explained" if ok else "partly",
                             f"max concurrency {la['max_concurrency']}x → {lb['max_concurrency']}x = KV tokens / window: "
                             f"{lb['kv_cache_tokens']:,} / {mlb:,} = {pred:.2f}x ({' and '.join(causes) or 'rounding'})"))

    # -- the failing start itself
    out += explain_failure(A, B, sa, sb, changed_setting, both)
    strong = {e["cause"] for e in out if e["status"] != "qualitative"}
    out = [e for e in out if e["status"] != "qualitative" or e["cause"] not in strong]
    return out


def explain_failure(A: dict, B: dict, sa: dict, sb: dict, changed_setting, both) -> list[dict]:
    """Why the failing start failed where the proven one did not, when the arithmetic can say it."""
    if B["class"] in ("unknown", "not_memory") or A["class"] == B["class"]:
        return []
    n, la = B["numbers"], A["ledger"]
    k = B["class"]
    diff = [x for x, _ in SETTINGS if changed_setting(x)]
    out: list[dict] = []
    if k == "free_memory_below_utilization" and n.get("free_at_start_bytes") and n.get("requested_bytes"):
        cause = "gpu_memory_utilization" if "gpu_memory_utilization" in diff else "free_before_start_bytes"
        out.append(_expl(cause, "setting" if cause in sa else "condition", sa.get(cause), sb.get(cause), ["outcome"],
                         "explained", f"the failing start's check: free {human_bytes(n['free_at_start_bytes'])} < "
                         f"gpu_memory_utilization {n.get('gpu_memory_utilization')} × total = "
                         f"{human_bytes(n['requested_bytes'])}" + (f"; the proven start used {sa.get(cause)}"
                                                                     if cause == "gpu_memory_utilization" else "")))
    elif k == "cuda_graph_oom" and "enforce_eager" in diff and sa.get("enforce_eager") and not sb.get("enforce_eager"):
        out.append(_expl("enforce_eager", "setting", sa["enforce_eager"], sb["enforce_eager"], ["outcome"], "explained",
                         "the failing start ran out of memory while capturing CUDA graphs; the proven start runs eager "
                         "(enforce_eager=True) and captures none"))
    elif k == "kv_allocation_oom" and "kv_cache_memory_bytes" in diff and _pin(B["settings"]):
        pin_b = _pin(B["settings"])
        free = n.get("initial_free_bytes")
        w = n.get("weights_bytes") or la.get("weights_bytes")
        txt = f"the failing start pins a {human_bytes(pin_b)} KV arena (the proven one {human_bytes(_pin(A['settings']))})"
        if free and w:
            left = free - w
            txt += (f"; initial free {human_bytes(free)} − weights {human_bytes(w)} = {human_bytes(left)} left, "
                    f"{'less' if pin_b > left else 'more'} than the arena")
        out.append(_expl("kv_cache_memory_bytes", "setting", _pin(A["settings"]), pin_b, ["outcome"],
                         "explained" if free and w and pin_b > free - w else "qualitative", txt))
    elif k == "kv_capacity" and "max_model_len" in diff and n.get("kv_needed_bytes") and n.get("kv_available_bytes"):
        bpt = la.get("kv_bytes_per_token")
        txt = (f"the failing window {sb['max_model_len']:,} needs {human_bytes(n['kv_needed_bytes'])} of KV for one "
               f"sequence, more than the {human_bytes(n['kv_available_bytes'])} available")
        if bpt:
            txt += f"; the proven window {sa['max_model_len']:,} × {bpt:,} B/token = {human_bytes(sa['max_model_len'] * bpt)}"
        out.append(_expl("max_model_len", "setting", sa["max_model_len"], sb["max_model_len"], ["outcome"], "explained", txt))
    elif k == "weights_load_oom" and both("free_before_start_bytes") and la.get("weights_bytes"):
        out.append(_expl("free_before_start_bytes", "condition", la["free_before_start_bytes"],
                         B["ledger"]["free_before_start_bytes"], ["outcome"], "qualitative",
                         f"the failing start had {human_bytes(B['ledger']['free_before_start_bytes'])} free before the "
                         f"start; the proven start's weights alone took {human_bytes(la['weights_bytes'])}"))
    if not out:
        out.append(_expl(diff[0] if diff else "unknown", "setting" if diff else "unknown", None, None, [], "candidates",
                         f"the failing start ended in {k}" + (f" at line {B['decisive']['line']}" if B.get("decisive") else "")
                         + (f"; settings that differ: {', '.join(diff)}" if diff else "; no setting differs")))
    return out


# ----------------------------------------------------------------------------- the comparison
def compare(proven: str | Path, failing: str | Path, engine: str | None = None, proven_version: str | None = None,
            failing_version: str | None = None) -> dict:
    for p in (proven, failing):
        if not Path(p).exists():
            raise BadInput(f"{p}: no such log")
    A = read_start(proven, engine, proven_version)
    B = read_start(failing, engine, failing_version)
    warnings: list[str] = []
    if A["engine"] and B["engine"] and A["engine"] != B["engine"]:
        raise BadInput(f"compare lines up two start-ups of one engine; {proven} is {A['engine']}, {failing} is {B['engine']}")
    same_version = A["engine_version"] == B["engine_version"] and A["engine_version"] is not None
    not_aligned: list[str] = []
    if not same_version:
        va, vb = A["engine_version"] or "unknown", B["engine_version"] or "unknown"
        not_aligned = [label for name, label, _, stable in LEDGER if not stable]
        warnings.append(f"different engine versions ({A['engine'] or '?'} {va} vs {vb}): only the version-stable rows are "
                        f"compared. Not aligned: {', '.join(not_aligned)} (their meaning or the line that prints them "
                        "differs between versions), and every setting left at a default whose value the log does not "
                        "print (defaults change between versions, e.g. max_num_seqs 256 → 1024)")
    same_launcher = A["launcher"] == B["launcher"]
    if not same_launcher:
        warnings.append(f"different launchers ({A['launcher']} vs {B['launcher']}): settings left at their defaults can "
                        "differ by usage context (offline LLM vs serve: max_num_seqs, max_num_batched_tokens); only the "
                        "printed values are compared")
    if A["model"] and B["model"] and A["model"] != B["model"]:
        warnings.append(f"different models ({A['model']} vs {B['model']}): weights and KV bytes per token differ by design")
    for src in ("nvml", "engine"):      # one source of the GPU total for both sides (NVML 140.40 GiB vs torch 139.80)
        if A["totals"][src] and B["totals"][src]:
            A["ledger"]["gpu_total_bytes"], B["ledger"]["gpu_total_bytes"] = A["totals"][src], B["totals"][src]
            break
    aligned_ledger = {name for name, _, _, stable in LEDGER if same_version or stable}
    aligned_settings = set()
    settings_rows = []
    for key, label in SETTINGS:
        a, b = A["settings"][key], B["settings"][key]
        known_a = a["source"] != "default" or a.get("known", False)
        known_b = b["source"] != "default" or b.get("known", False)
        aligned = (known_a and known_b) or (same_version and same_launcher)
        if aligned:
            aligned_settings.add(key)
        changed = aligned and a["value"] != b["value"]
        kind = "bytes" if key == "kv_cache_memory_bytes" else ("tokens" if key in ("max_model_len", "max_num_batched_tokens") else "")
        settings_rows.append({"name": key, "label": label, "proven": a["value"], "proven_source": a["source"],
                              "failing": b["value"], "failing_source": b["source"], "changed": changed, "aligned": aligned,
                              "delta": (fmt_delta(a["value"], b["value"], kind) if a["value"] is not None and
                                        b["value"] is not None else
                                        f"{'set' if a['value'] is not None else 'default'} → "
                                        f"{'set' if b['value'] is not None else 'default'}") if changed else ""})
    expls = explain(A, B, aligned_ledger, aligned_settings)
    ledger_rows = []
    unexplained = []
    for name, label, kind, stable in LEDGER:
        a, b = A["ledger"].get(name), B["ledger"].get(name)
        aligned = name in aligned_ledger
        changed = aligned and _significant(a, b, kind)
        by = [e["cause"] for e in expls if name in e["explains"]]
        row = {"name": name, "label": label, "unit": kind, "proven": a, "failing": b, "aligned": aligned,
               "changed": changed, "delta": fmt_delta(a, b, kind) if aligned else "", "explained_by": by}
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
            row["delta_exact"] = b - a
        if aligned and (a is None) != (b is None) and not by:
            missing = "failing" if b is None else "proven"
            side = B if b is None else A
            changed = False
            row["note"] = (f"not printed by the {missing} start" +
                           (f" (it stopped in phase {side['phase_reached']}: {side['class']})"
                            if side["class"] not in ("unknown", "kv_preemption") else ""))
        elif changed and name in CONDITIONS:
            row["note"] = "a start condition, not a result of the settings"
        elif changed and name in TIMINGS and not by:
            row["note"] = "timing: varies between runs (compile caches)"
        elif changed and not by:
            unexplained.append(name)
        ledger_rows.append(row)
    outcome = {"proven": A["class"], "failing": B["class"],
               "explained_by": [e["cause"] for e in expls if "outcome" in e["explains"]]}
    changed_settings = [r["name"] for r in settings_rows if r["changed"]]
    main = [e for e in expls if e["status"] in ("explained", "inferred") and e["cause_kind"] in ("setting", "condition")
            and e["explains"]]
    main.sort(key=lambda e: "outcome" not in e["explains"])
    if main:
        verdict = "; ".join(e["arithmetic"] for e in main[:3])
    elif changed_settings:
        verdict = f"settings changed ({', '.join(changed_settings)}) but the ledgers do not show their effect in the printed figures"
    else:
        verdict = "no setting differs between the two starts" + (": the differences come from the start conditions "
                                                                  "or the engine" if unexplained or not same_version else "")
    return {
        "proven": {k: A[k] for k in ("path", "engine", "engine_version", "class", "rule", "phase_reached", "model", "decisive")},
        "failing": {k: B[k] for k in ("path", "engine", "engine_version", "class", "rule", "phase_reached", "model", "decisive")},
        "same_version": same_version, "warnings": warnings, "not_aligned": not_aligned,
        "outcome": outcome, "settings": settings_rows, "ledger": ledger_rows, "explanations": expls,
        "changed_settings": changed_settings, "unexplained": unexplained, "verdict": verdict,
    }


# ----------------------------------------------------------------------------- output
def print_tables(res: dict, file=None) -> None:
    import sys

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    con = Console(file=file or sys.stdout)
    pa, pb = res["proven"], res["failing"]
    con.print(Text(f"proven:  {pa['path']} — {pa['engine'] or '?'} {pa['engine_version'] or '?'}, {pa['class']}"))
    con.print(Text(f"failing: {pb['path']} — {pb['engine'] or '?'} {pb['engine_version'] or '?'}, {pb['class']}"
                   + (f" (line {pb['decisive']['line']})" if pb.get("decisive") else "")))
    oc = res["outcome"]
    if oc["proven"] != oc["failing"]:
        con.print(Text(f"outcome: {oc['proven']} → {oc['failing']}"
                       + (f" — explained by {', '.join(oc['explained_by'])}" if oc["explained_by"] else "")))
    for w in res["warnings"]:
        con.print(Text("warning: " + w, style="yellow"))
    t = Table(title="Settings", title_justify="left")
    for c in ("setting", "proven", "failing", "change"):
        t.add_column(c)
    for r in res["settings"]:
        kind = "bytes" if r["name"] == "kv_cache_memory_bytes" else ""
        src = lambda v, s: Text(fmt_value(v, kind) + ("" if s == "explicit" else f" ({s})"))  # noqa: E731
        t.add_row(r["label"], src(r["proven"], r["proven_source"]), src(r["failing"], r["failing_source"]),
                  Text(r["delta"] or ("changed" if r["changed"] else ("" if r["aligned"] else "not aligned")),
                       style="bold" if r["changed"] else ""))
    con.print(t)
    t = Table(title="Ledger", title_justify="left")
    for c in ("row", "proven", "failing", "change", "explained by"):
        t.add_column(c)
    for r in res["ledger"]:
        if r["proven"] is None and r["failing"] is None:
            continue
        t.add_row(r["label"], fmt_value(r["proven"], r["unit"]), fmt_value(r["failing"], r["unit"]),
                  Text(r["delta"] if r["aligned"] else "not aligned (versions)", style="bold" if r["changed"] else ""),
                  Text(", ".join(r["explained_by"]) or r.get("note", "") or ("?" if r["changed"] else "")))
    con.print(t)
    for e in res["explanations"]:
        con.print(Text(f"[{e['status']}] {e['arithmetic']}"))
    if res["unexplained"]:
        con.print(Text("not explained by a setting change: " + ", ".join(res["unexplained"]), style="yellow"))


def plot(res: dict, path: str | Path) -> Path:
    """Both ledgers as stacked bars (weights / activations / CUDA graphs / KV / other). Needs matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise BadInput("--plot needs matplotlib: pip install 'oomdoctor[plot]'")
    rows = {r["name"]: r for r in res["ledger"]}
    pins = {s["name"]: s for s in res["settings"]}["kv_cache_memory_bytes"]
    parts = [("weights", "weights_bytes", "#4c72b0"), ("activations", "activation_peak_bytes", "#dd8452"),
             ("CUDA graphs", "cuda_graph_bytes", "#55a868"), ("KV", None, "#c44e52"), ("other (non-torch)", "non_torch_bytes", "#8172b3")]
    fig = Figure(figsize=(6.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    def value(key: str | None, side: str) -> float:
        if key is None:
            v = rows["kv_cache_memory_bytes"][side] or (pins[side] if isinstance(pins[side], (int, float)) else None) \
                or rows["kv_available_bytes"][side]
        else:
            v = rows[key][side]
        return (v or 0) / GiB

    missing = [name for name, key, _ in parts if not any(value(key, s) for s in ("proven", "failing"))]
    for i, side in enumerate(("proven", "failing")):
        bottom = 0.0
        for name, key, color in parts:
            v = value(key, side)
            if name in missing:
                continue
            ax.bar(i, v, bottom=bottom, color=color, label=name if i == 0 else None, width=0.55)
            if v > 0.05:
                ax.text(i, bottom + v / 2, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white")
            bottom += v
        free = rows["free_before_start_bytes"][side]
        if free:
            ax.plot([i - 0.3, i + 0.3], [free / GiB] * 2, color="black", linestyle="--", linewidth=1,
                    label="free before the start" if i == 0 else None)
    if missing:
        ax.text(0.0, -0.16, "not printed by these logs: " + ", ".join(missing), transform=ax.transAxes, fontsize=7)
    ax.set_xticks([0, 1])
    ax.set_xticklabels([f"proven\n{Path(res['proven']['path']).name}", f"failing\n{Path(res['failing']['path']).name}"])
    ax.set_ylabel("GiB")
    ax.set_title("Start-up ledgers")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out
