"""Why the failing start failed where the proven one did not: one explanation per failure class, where the
failing start's own numbers can say it."""
from __future__ import annotations

from typing import Any, Callable

from oomdoctor.analysis.compare.explain import Explanation, _expl
from oomdoctor.analysis.compare.read import Start, _pin
from oomdoctor.analysis.compare.tables import SETTINGS
from oomdoctor.units import human_bytes

Check = Callable[[str], bool]


def _free_below_utilization(A: Start, B: Start, sa: dict[str, Any], sb: dict[str, Any], diff: list[str],
                            both: Check) -> list[Explanation]:
    n = B["numbers"]
    if not (n.get("free_at_start_bytes") and n.get("requested_bytes")):
        return []
    cause = "gpu_memory_utilization" if "gpu_memory_utilization" in diff else "free_before_start_bytes"
    return [_expl(cause, "setting" if cause in sa else "condition", sa.get(cause), sb.get(cause), ["outcome"],
                  "explained", f"the failing start's check: free {human_bytes(n['free_at_start_bytes'])} < "
                  f"gpu_memory_utilization {n.get('gpu_memory_utilization')} × total = "
                  f"{human_bytes(n['requested_bytes'])}" + (f"; the proven start used {sa.get(cause)}"
                                                              if cause == "gpu_memory_utilization" else ""))]


def _cuda_graph(A: Start, B: Start, sa: dict[str, Any], sb: dict[str, Any], diff: list[str],
                both: Check) -> list[Explanation]:
    if not ("enforce_eager" in diff and sa.get("enforce_eager") and not sb.get("enforce_eager")):
        return []
    return [_expl("enforce_eager", "setting", sa["enforce_eager"], sb["enforce_eager"], ["outcome"], "explained",
                  "the failing start ran out of memory while capturing CUDA graphs; the proven start runs eager "
                  "(enforce_eager=True) and captures none")]


def _kv_allocation(A: Start, B: Start, sa: dict[str, Any], sb: dict[str, Any], diff: list[str],
                   both: Check) -> list[Explanation]:
    pin_b = _pin(B["settings"])
    if not ("kv_cache_memory_bytes" in diff and pin_b):
        return []
    n, la = B["numbers"], A["ledger"]
    free = n.get("initial_free_bytes")
    w = n.get("weights_bytes") or la.get("weights_bytes")
    txt = f"the failing start pins a {human_bytes(pin_b)} KV arena (the proven one {human_bytes(_pin(A['settings']))})"
    if free and w:
        left = free - w
        txt += (f"; initial free {human_bytes(free)} − weights {human_bytes(w)} = {human_bytes(left)} left, "
                f"{'less' if pin_b > left else 'more'} than the arena")
    return [_expl("kv_cache_memory_bytes", "setting", _pin(A["settings"]), pin_b, ["outcome"],
                  "explained" if free and w and pin_b > free - w else "qualitative", txt)]


def _kv_capacity(A: Start, B: Start, sa: dict[str, Any], sb: dict[str, Any], diff: list[str],
                 both: Check) -> list[Explanation]:
    n = B["numbers"]
    if not ("max_model_len" in diff and n.get("kv_needed_bytes") and n.get("kv_available_bytes")):
        return []
    bpt = A["ledger"].get("kv_bytes_per_token")
    txt = (f"the failing window {sb['max_model_len']:,} needs {human_bytes(n['kv_needed_bytes'])} of KV for one "
           f"sequence, more than the {human_bytes(n['kv_available_bytes'])} available")
    if bpt:
        txt += f"; the proven window {sa['max_model_len']:,} × {bpt:,} B/token = {human_bytes(sa['max_model_len'] * bpt)}"
    return [_expl("max_model_len", "setting", sa["max_model_len"], sb["max_model_len"], ["outcome"], "explained", txt)]


def _weights_load(A: Start, B: Start, sa: dict[str, Any], sb: dict[str, Any], diff: list[str],
                  both: Check) -> list[Explanation]:
    la = A["ledger"]
    if not (both("free_before_start_bytes") and la.get("weights_bytes")):
        return []
    return [_expl("free_before_start_bytes", "condition", la["free_before_start_bytes"],
                  B["ledger"]["free_before_start_bytes"], ["outcome"], "qualitative",
                  f"the failing start had {human_bytes(B['ledger']['free_before_start_bytes'])} free before the "
                  f"start; the proven start's weights alone took {human_bytes(la['weights_bytes'])}")]


BY_CLASS = {
    "free_memory_below_utilization": _free_below_utilization,
    "cuda_graph_oom": _cuda_graph,
    "kv_allocation_oom": _kv_allocation,
    "kv_capacity": _kv_capacity,
    "weights_load_oom": _weights_load,
}


def explain_failure(A: Start, B: Start, sa: dict[str, Any], sb: dict[str, Any], changed_setting: Check,
                    both: Check) -> list[Explanation]:
    """Why the failing start failed where the proven one did not, when the arithmetic can say it."""
    if B["class"] in ("unknown", "not_memory") or A["class"] == B["class"]:
        return []
    k = B["class"]
    diff = [x for x, _ in SETTINGS if changed_setting(x)]
    rule = BY_CLASS.get(k)
    out = rule(A, B, sa, sb, diff, both) if rule else []
    if not out:
        out.append(_expl(diff[0] if diff else "unknown", "setting" if diff else "unknown", None, None, [], "candidates",
                         f"the failing start ended in {k}" + (f" at line {B['decisive']['line']}" if B.get("decisive") else "")
                         + (f"; settings that differ: {', '.join(diff)}" if diff else "; no setting differs")))
    return out
