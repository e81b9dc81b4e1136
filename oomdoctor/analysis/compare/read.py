"""Reading one start-up: its settings (explicit, resolved or default) and its memory ledger."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from oomdoctor.analysis.compare.tables import KNOWN_DEFAULTS, SETTINGS

Start = dict[str, Any]       # what read_start returns: path, engine, class, settings, ledger, numbers, ...


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


