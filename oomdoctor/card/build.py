"""The card stage: a diagnosis, its workload, device state and levers become one incident card."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

from oomdoctor.card.records import CardDict

#: units of a number whose byte count is exact as printed; any other unit (GiB, MiB, a "size" with its unit) means
#: the log rounded it and the bytes are rebuilt from its digits
_EXACT_UNITS = frozenset({"b", "int", "count", "tokens", "float", "ratio", "percent", "seconds", "str"})
_SIZE_TEXT = re.compile(r"\s{0,4}[\d.,]{1,32}\s{0,4}([KMGTPE]i?B?|[kmgtpe]i?b)\s{0,4}")


def printed_figures(matches: list, numbers_source: dict[str, int]) -> dict[str, str]:
    """The byte numbers the log printed in a unit larger than a byte, as it printed them (``124.52 GiB``): their
    byte counts are rebuilt from the printed digits, exact only to those (the screen writes them with ≈)."""
    by_line: dict[int, list] = {}
    for m in matches:
        by_line.setdefault(m.n, []).append(m)
    out: dict[str, str] = {}
    for k, n in numbers_source.items():
        if not k.endswith("_bytes"):
            continue
        for m in by_line.get(n, []):
            spec = next((s for s in m.rule.numbers if s.name == k), None)
            raw = m.groups.get(spec.group) if spec is not None else None
            if spec is None or raw is None:
                continue
            if spec.unit == "size":
                if _SIZE_TEXT.fullmatch(raw):
                    out[k] = raw.strip()
            elif spec.unit.lower() not in _EXACT_UNITS:
                out[k] = f"{raw.strip()} {spec.unit}"
            break
    return out


def build_card(log: Path, diag: Any, device_state: dict, extra_notes: list[str] | None = None) -> CardDict:
    from oomdoctor.card import store as cardmod
    from oomdoctor.levers import engine as levermod
    from oomdoctor.device.nvml import log_device_statements
    from oomdoctor.card.workload import from_log

    wl = from_log(log, diag.matches, diag.engine)
    nums = dict(diag.numbers)
    # the matched rule lists the levers that apply to its failure (data); the lever engine ranks them
    # levers are settings of the log's engine: with no engine recognised (a paste of one OOM line that several engines
    # print alike) none is proposed, and the card says how to name the engine
    levers = levermod.propose(diag.klass, nums, wl, device_state, [], allowed=diag.levers or None,
                               engine=diag.engine, version=diag.engine_version) \
        if diag.engine or not diag.is_memory_failure else []
    if diag.engine is None and diag.is_memory_failure:
        diag.notes.append("no engine recognised: no lever proposed (levers are an engine's settings); pass --engine "
                          "ENGINE to get them")
    summary = diag.message.split(". ")[0].strip() if diag.message else ""
    if diag.klass == "unknown" and not diag.root:
        summary = "; ".join(diag.notes[:1]) or "no failure found in the log"
    c = cardmod.Card(
        id=cardmod.new_id(diag.klass, diag.source.sha256),
        created_at=cardmod.now_iso(),
        summary=summary,
        source={"path": str(log), "sha256": diag.source.sha256, "size_bytes": diag.source.size_bytes,
                "lines": diag.source.lines, "compressed": diag.source.compressed},
        engine={"name": diag.engine, "version": diag.engine_version, "version_line": diag.engine_version_line},
        classification={**diag.classification(), "basis": diag.phase_basis},
        phase_reached=diag.phase_reached,
        evidence=diag.evidence,
        numbers=nums,
        numbers_source=diag.numbers_source,
        numbers_printed=printed_figures(diag.matches, diag.numbers_source),
        numbers_by_process=diag.numbers_by_process,
        device=device_state,
        log_device=log_device_statements(nums, diag.numbers_source),
        workload=wl,
        levers=levers,
        runtime=card_runtime(diag.runtime),
        notes=list(diag.notes) + list(extra_notes or []),
    )
    return cast(CardDict, c.to_dict())


CARD_TIMELINE_SAMPLES = 240


def card_runtime(summary: dict) -> dict:
    """The runtime summary as the card keeps it: the preemption episodes, and at most 240 timeline samples."""
    if not summary:
        return {}
    from oomdoctor.analysis.timeline import episodes

    out = dict(summary)
    tl = summary.get("timeline") or []
    if len(tl) > CARD_TIMELINE_SAMPLES:
        step = -(-len(tl) // CARD_TIMELINE_SAMPLES)
        out["timeline"] = tl[::step]
        out["timeline_downsampled_from"] = len(tl)
    out["episodes"] = episodes(summary)
    return out
