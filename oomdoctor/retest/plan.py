"""Retest, step 1: the ONE change — which lever, the workload with it (and the kept changes of earlier attempts),
the free memory to reproduce, the command line."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from oomdoctor.card.records import CardDict, Lever, Workload
from oomdoctor.card.workload import NOT_REPLAYED_ENV
from oomdoctor.engines.vllm.defaults import CUDA_CONTEXT_BYTES
from oomdoctor.errors import BadInput
from oomdoctor.levers.context import counts_as_tried
from oomdoctor.levers.hardware import hardware_need
from oomdoctor.redact import MASK
from oomdoctor.retest.launch import launch_argv
from oomdoctor.units import NAMED_CARDS, human_bytes, parse_size

UNAPPLIABLE = {"larger_gpu": "needs other hardware", "admission_queue": "is a server-side change, not an engine setting",
               "tensor_parallel_size": None, "pipeline_parallel_size": None}


@dataclass
class Plan:
    lever: Lever
    workload: Workload
    base_changes: list[dict[str, Any]]
    argv: list[str]
    env: dict[str, str]
    emulate_free_bytes: int | None
    target_device: str | None
    description: list[str] = field(default_factory=list)


def lever_needs_hardware(lv: Lever, card: CardDict, device: dict[str, Any] | None) -> str | None:
    """Why the device cannot apply ``lv``: marked on the card, or found now (the card's device, else this machine's)."""
    if lv.get("needs_hardware"):
        return lv["needs_hardware"]
    dev = card.get("device") if (card.get("device") or {}).get("status") == "captured" else device
    return hardware_need(lv, card.get("workload") or {}, dev)


def choose_lever(card: CardDict, lever_id: str | None, next_: bool, device: dict[str, Any] | None = None,
                 mode: str = "real") -> Lever:
    """``--lever ID``, else the first lever (``--next``: the first not tried yet) that this device can apply."""
    levers = card.get("levers") or []
    tried = [(a.get("lever"), a.get("change")) for a in card.get("attempts") or [] if counts_as_tried(a)]
    if lever_id:
        for lv in levers:
            if lv["id"] == lever_id:
                why = lever_needs_hardware(lv, card, device)
                if why and mode != "twin":
                    raise BadInput(f"lever '{lever_id}' needs other hardware: {why}; a retest never runs it")
                return lv
        if lever_id == "none":
            return {"id": "none", "change": {}, "rank": 0, "predicted": {}, "cost": "nothing: reproduces the recorded failure"}
        raise BadInput(f"lever '{lever_id}' is not among the card's levers ({', '.join(lv['id'] for lv in levers) or 'none'})")
    hardware = []
    for lv in levers:
        if next_ and (lv["id"], lv["change"]) in tried:
            continue
        why = lever_needs_hardware(lv, card, device)
        if why:
            hardware.append(f"{lv['id']} ({why})")
            continue
        return lv
    if hardware:
        raise BadInput("no lever left that this device can apply; needs other hardware: " + "; ".join(hardware))
    raise BadInput("no lever left to try on this card" if levers else
                   f"the card has no levers (class {card['classification']['class']}): nothing to retest")


def kept_changes(card: CardDict) -> list[dict[str, Any]]:
    """Changes of earlier real attempts that made their own failure go away: the next attempt builds on them."""
    out = []
    for a in card.get("attempts") or []:
        if (a.get("engine", {}).get("mode") == "real" and a.get("signature_gone") and counts_as_tried(a)
                and a.get("lever") not in (None, "none")):
            out.append({"lever": a["lever"], "change": a["change"]})
    return out


def apply_change(wl: Workload, lever_id: str, change: dict[str, Any]) -> tuple[Workload, str]:
    wl = copy.deepcopy(wl)
    args = wl.setdefault("engine_args", {})
    env = wl.setdefault("env", {})
    if lever_id in ("larger_gpu", "admission_queue"):
        raise BadInput(f"lever '{lever_id}' {UNAPPLIABLE[lever_id]}: a re-run cannot apply it")
    if lever_id == "free_other_processes":
        wl["co_tenant_bytes"] = None
        wl["emulate_free_bytes"] = wl.get("card_emulate_free_bytes")
        return wl, "the co-tenant that held memory is not started (on this device it was reproduced by a ballast)"
    if lever_id == "expandable_segments":
        env["PYTORCH_CUDA_ALLOC_CONF"] = change.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        return wl, f"env PYTORCH_CUDA_ALLOC_CONF={env['PYTORCH_CUDA_ALLOC_CONF']}"
    desc = []
    for k, v in change.items():
        args[k] = v
        desc.append(f"{k}={v}")
    return wl, ("engine argument " if wl.get("launcher") == "vllm-llm" else "flag ") + ", ".join(desc)


def target_free_from_card(card: CardDict) -> tuple[int | None, str]:
    wl = card.get("workload") or {}
    emulate = wl.get("emulate_free_bytes")
    if emulate:
        return int(emulate), "workload.emulate_free_bytes"
    if wl.get("free_at_start_bytes"):
        return int(wl["free_at_start_bytes"]), wl.get("free_at_start_source", "workload.free_at_start_bytes")
    n = card.get("numbers") or {}
    if n.get("free_at_start_bytes"):
        return int(n["free_at_start_bytes"]) + CUDA_CONTEXT_BYTES, "the engine's free-memory check + its CUDA context"
    if n.get("initial_free_bytes"):
        return int(n["initial_free_bytes"]) + CUDA_CONTEXT_BYTES, "the worker's initial free memory + its CUDA context"
    if n.get("gpu_free_bytes") is not None and n.get("other_process_bytes"):
        total = n.get("gpu_total_bytes")
        if total:
            return int(total) - int(n["other_process_bytes"]), "total - the co-tenant named in the OOM message"
    return None, ""


def plan(card: CardDict, lever: Lever, emulate: str | None, gpu_index: int, no_emulate: bool) -> Plan:
    wl0 = copy.deepcopy(card.get("workload") or {})
    if wl0.get("launcher") in (None, "unknown"):
        raise BadInput("the card's workload does not say how the engine was launched (workload.launcher); "
                       "record it with `oomdoctor record -- vllm serve ...`")
    if not wl0.get("model") and wl0.get("launcher") != "command":
        raise BadInput("the card's workload has no model (workload.model)")
    base = kept_changes(card)
    desc = []
    target, target_src = (None, "")
    if emulate:
        key = emulate.lower().replace("_", "").replace(" ", "")
        target = parse_size(emulate)
        target_src = f"--emulate {emulate}"
        wl0["card_emulate_free_bytes"] = target
        if key in NAMED_CARDS:
            desc.append(f"emulating {NAMED_CARDS[key][0]}: a ballast leaves {human_bytes(target)} free")
    elif not no_emulate:
        target, target_src = target_free_from_card(card)
    wl0["emulate_free_bytes"] = target
    co = card.get("numbers", {}).get("other_process_bytes")
    if co and not emulate:
        wl0["co_tenant_bytes"] = int(co)
    wl = wl0
    for b in base:
        wl, d = apply_change(wl, b["lever"], b["change"])
        desc.append(f"kept from an earlier attempt: {b['lever']} ({d})")
    if lever["id"] != "none":
        wl, d = apply_change(wl, lever["id"], lever["change"])
        desc.append(f"this attempt's ONE change: {lever['id']} → {d}")
    else:
        desc.append("no change: reproduce the recorded failure")
    if wl.get("emulate_free_bytes"):
        desc.append(f"free memory at start reproduced with a ballast: {human_bytes(wl['emulate_free_bytes'])} ({target_src})")
    env = {k: str(v) for k, v in (wl.get("env") or {}).items() if v != MASK and k not in NOT_REPLAYED_ENV}
    tdev = None
    if emulate and emulate.lower().replace("_", "") in NAMED_CARDS:
        tdev = emulate.lower().replace("_", "")
    return Plan(lever=lever, workload=wl, base_changes=base, argv=launch_argv(wl, 0), env=env,
                emulate_free_bytes=wl.get("emulate_free_bytes"), target_device=tdev, description=desc)


