"""Read a PyTorch CUDA memory snapshot safely (no torch, no code execution) and explain it.

A snapshot is what ``torch.cuda.memory._dump_snapshot(path)`` writes: ``pickle.dump`` of the
plain dict returned by ``torch.cuda.memory._snapshot()`` (see that function's docstring in
torch/cuda/memory.py and ``_memory_snapshot`` in torch/csrc/cuda/Module.cpp)::

    {"segments": [Segment], "device_traces": [[TraceEntry] per device],
     "allocator_settings": {...}, "external_annotations": [...]}      # the last two: newer torch
    Segment    = {device, address, total_size, allocated_size, active_size, requested_size, stream,
                  segment_type: 'small'|'large', segment_pool_id, is_expandable, frames, blocks: [Block]}
    Block      = {address, size, requested_size, state, frames: [Frame]}
                 state: 'active_allocated' | 'active_pending_free' | 'inactive'
    Frame      = {filename, line, name}                     # frames[0] is the innermost call
    TraceEntry = {action, addr | device_free (for 'oom'), size, stream, frames, time_us?}
                 action: alloc, free_requested, free_completed, segment_alloc, segment_free,
                         segment_map, segment_unmap, snapshot, oom

Such a pickle holds only dicts, lists, tuples, strings, numbers, booleans and None: nothing that
needs a class. :class:`SafeUnpickler` therefore refuses every class/function lookup, so a
pickle that tries to import anything (``os.system`` ...) is stopped before it runs anything.
"""
from __future__ import annotations

import copyreg
import io
import pickle
from pathlib import Path
from typing import Any

from oomdoctor.errors import BadInput

ACTIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")
BLOCK_STATES = ACTIVE_STATES + ("inactive",)
TOP_SITES = 10
NO_STACK = "(no stack: allocated before memory history was recorded)"
_NATIVE_EXT = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh", ".so")


class SnapshotRefused(BadInput):
    """The file is not a plain-data memory snapshot (it tried to import something)."""


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that loads plain data only: every global lookup is refused."""

    def find_class(self, module: str, name: str):  # noqa: D401 - pickle API
        raise SnapshotRefused(f"refused: the pickle tries to import {module}.{name}; a memory snapshot "
                              "holds plain data only (nothing was executed)")

    def persistent_load(self, pid):  # noqa: D401 - pickle API
        raise SnapshotRefused("refused: the pickle uses a persistent id (torch.save-style file?); "
                              "a memory snapshot holds plain data only")


# ----------------------------------------------------------------------------- loading
def load_snapshot(path: str | Path) -> dict:
    """Unpickle ``path`` without importing anything, then check its shape. Raises BadInput."""
    from oomdoctor.analysis.pickleguard import MAX_BYTES, check_data, scan_opcodes
    from oomdoctor.diagnose.read import read_capped

    p = Path(path)
    raw = read_capped(p, MAX_BYTES, "snapshot pickle")    # a FIFO or device is refused, not waited on
    if not raw:
        raise BadInput(f"{p}: empty file, not a memory snapshot")
    if raw[:1] != b"\x80":
        raise BadInput(f"{p}: not a pickle (a memory snapshot from torch.cuda.memory._dump_snapshot "
                       "starts with a pickle protocol header)")
    if getattr(copyreg, "_extension_cache", None):
        # EXT opcodes are resolved from this process-wide cache without calling find_class.
        raise BadInput(f"{p}: refusing to unpickle: the pickle extension cache of this process is in use")
    scan_opcodes(raw, str(p))
    try:
        data = SafeUnpickler(io.BytesIO(raw)).load()
    except SnapshotRefused as e:
        raise SnapshotRefused(f"{p}: {e}")
    except RecursionError:
        raise BadInput(f"{p}: the pickle nests too deeply to be a memory snapshot")
    except MemoryError:
        raise BadInput(f"{p}: the pickle does not fit in memory")
    except Exception as e:  # noqa: BLE001 - any decoding failure is bad input
        raise BadInput(f"{p}: not a readable pickle ({type(e).__name__}: {e})")
    check_data(data, str(p))
    validate(data, str(p))
    return data


def _fail(where: str, field: str, why: str) -> BadInput:
    return BadInput(f"{where}: not a torch memory snapshot: field '{field}' {why}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_frames(frames: Any, where: str, field: str) -> None:
    if not isinstance(frames, list):
        raise _fail(where, field, f"must be a list, got {type(frames).__name__}")
    for k, f in enumerate(frames):
        if not isinstance(f, dict):
            raise _fail(where, f"{field}[{k}]", f"must be a dict, got {type(f).__name__}")


def _check_ints(d: dict, keys: tuple[str, ...], where: str, f: str) -> None:
    for key in keys:
        if key in d and not _is_int(d[key]):
            raise _fail(where, f"{f}.{key}", f"must be an integer, got {type(d[key]).__name__}")


def _check_block(b: Any, where: str, fb: str) -> None:
    if not isinstance(b, dict):
        raise _fail(where, fb, f"must be a dict, got {type(b).__name__}")
    if "size" not in b:
        raise _fail(where, f"{fb}.size", "is missing")
    _check_ints(b, ("size", "requested_size", "address"), where, fb)
    if "state" not in b:
        raise _fail(where, f"{fb}.state", "is missing")
    if b["state"] not in BLOCK_STATES:
        raise _fail(where, f"{fb}.state", f"must be one of {', '.join(BLOCK_STATES)}, got {b['state']!r}")
    if "frames" in b:
        _check_frames(b["frames"], where, f"{fb}.frames")


def _check_segment(s: Any, where: str, f: str) -> None:
    if not isinstance(s, dict):
        raise _fail(where, f, f"must be a dict, got {type(s).__name__}")
    for key in ("address", "total_size"):
        if key not in s:
            raise _fail(where, f"{f}.{key}", "is missing")
    _check_ints(s, ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream"),
                where, f)
    if "segment_type" in s and not isinstance(s["segment_type"], str):
        raise _fail(where, f"{f}.segment_type", "must be a string")
    if "frames" in s:
        _check_frames(s["frames"], where, f"{f}.frames")
    blocks = s.get("blocks", [])
    if not isinstance(blocks, list):
        raise _fail(where, f"{f}.blocks", f"must be a list, got {type(blocks).__name__}")
    for j, b in enumerate(blocks):
        _check_block(b, where, f"{f}.blocks[{j}]")


def _check_traces(traces: Any, where: str) -> None:
    if not isinstance(traces, list):
        raise _fail(where, "device_traces", f"must be a list, got {type(traces).__name__}")
    for d, dev in enumerate(traces):
        if not isinstance(dev, list):
            raise _fail(where, f"device_traces[{d}]", f"must be a list, got {type(dev).__name__}")
        for k, t in enumerate(dev):
            ft = f"device_traces[{d}][{k}]"
            if not isinstance(t, dict):
                raise _fail(where, ft, f"must be a dict, got {type(t).__name__}")
            if not isinstance(t.get("action"), str):
                raise _fail(where, f"{ft}.action", "must be a string")
            _check_ints(t, ("size", "addr", "device_free"), where, ft)
            if "frames" in t:
                _check_frames(t["frames"], where, f"{ft}.frames")


def validate(data: Any, where: str = "snapshot") -> None:
    """Check the structure the analysis relies on; name the first field that is wrong."""
    if not isinstance(data, dict):
        kind = type(data).__name__
        hint = " (torch.cuda.memory_snapshot() returns the segment list only; use _dump_snapshot)" if kind == "list" else ""
        raise BadInput(f"{where}: not a torch memory snapshot: expected a dict with 'segments' at the top level, "
                       f"got a {kind}{hint}")
    if "segments" not in data:
        raise _fail(where, "segments", "is missing (keys: " + ", ".join(sorted(map(str, data))[:8]) + ")")
    segs = data["segments"]
    if not isinstance(segs, list):
        raise _fail(where, "segments", f"must be a list, got {type(segs).__name__}")
    for i, s in enumerate(segs):
        _check_segment(s, where, f"segments[{i}]")
    _check_traces(data.get("device_traces", []), where)
    if "allocator_settings" in data and not isinstance(data["allocator_settings"], dict):
        raise _fail(where, "allocator_settings", "must be a dict")


# ----------------------------------------------------------------------------- analysis
def _is_library_frame(f: dict) -> bool:
    fn = str(f.get("filename") or "")
    name = str(f.get("name") or "")
    if not fn or fn.startswith("??"):
        return True
    if fn.lower().endswith(_NATIVE_EXT) or "::" in name:
        return True                                   # C++/CUDA frames (stacks='all')
    norm = fn.replace("\\", "/")
    if "/torch/" in norm or norm.startswith("torch/") or norm.startswith("<frozen "):
        return True
    return False


def site_of(frames: list[dict] | None) -> dict:
    """The innermost frame outside torch / native code: where the user code asked for memory."""
    for f in frames or []:
        if not _is_library_frame(f):
            return {"site": f"{f.get('filename')}:{f.get('line')} {f.get('name')}",
                    "filename": f.get("filename"), "line": f.get("line"), "name": f.get("name")}
    if frames:
        f = frames[0]
        return {"site": f"(inside torch) {f.get('filename')}:{f.get('line')} {f.get('name')}",
                "filename": f.get("filename"), "line": f.get("line"), "name": f.get("name")}
    return {"site": NO_STACK, "filename": None, "line": None, "name": None}


def _fragmentation(largest: int, free: int) -> float:
    return round(1.0 - largest / free, 6) if free > 0 else 0.0


def _segment_summary(s: dict) -> dict:
    blocks = s.get("blocks", [])
    inactive = [b["size"] for b in blocks if b["state"] == "inactive"]
    if "allocated_size" in s:
        allocated = s["allocated_size"]
    else:
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    if "active_size" in s:
        active = s["active_size"]
    else:
        active = sum(b["size"] for b in blocks if b["state"] in ACTIVE_STATES)
    total = s["total_size"]
    free = sum(inactive) if blocks else max(total - active, 0)
    largest = max(inactive) if inactive else (free if not blocks else 0)
    return {
        "device": s.get("device", 0),
        "address": s["address"],
        "segment_type": s.get("segment_type"),
        "stream": s.get("stream"),
        "is_expandable": bool(s.get("is_expandable", False)),
        "total_size_bytes": total,
        "allocated_bytes": allocated,
        "active_bytes": active,
        "requested_bytes": s.get("requested_size", sum(b.get("requested_size", 0) for b in blocks
                                                       if b["state"] == "active_allocated")),
        "free_bytes": free,
        "largest_free_block_bytes": largest,
        "free_blocks": len(inactive),
        "blocks": len(blocks),
    }


def _totals(segs: list[dict]) -> dict:
    reserved = sum(s["total_size_bytes"] for s in segs)
    allocated = sum(s["allocated_bytes"] for s in segs)
    free = sum(s["free_bytes"] for s in segs)
    largest = max((s["largest_free_block_bytes"] for s in segs), default=0)
    return {
        "segments": len(segs),
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "active_bytes": sum(s["active_bytes"] for s in segs),
        "requested_bytes": sum(s["requested_bytes"] for s in segs),
        "reserved_unallocated_bytes": reserved - allocated,
        "free_bytes": free,
        "largest_free_block_bytes": largest,
        "fragmentation": _fragmentation(largest, free),
    }


def _oom_events(traces: list) -> list[dict]:
    out = []
    for d, dev in enumerate(traces):
        for k, t in enumerate(dev):
            if t.get("action") != "oom":
                continue
            ev = {"device": d, "trace_index": k, "requested_bytes": t.get("size"),
                  "device_free_bytes": t.get("device_free"), "stream": t.get("stream")}
            if "time_us" in t:
                ev["time_us"] = t["time_us"]
            ev.update({"site": site_of(t.get("frames"))["site"]})
            out.append(ev)
    return out


def analyze(data: dict, top: int = TOP_SITES, source: str | None = None) -> dict:
    """The report for a validated snapshot dict (see module docstring for the format)."""
    segs = [_segment_summary(s) for s in data["segments"]]
    devices: dict[int, list[dict]] = {}
    for s in segs:
        devices.setdefault(s["device"], []).append(s)
    per_device = [{"device": d, **_totals(ss)} for d, ss in sorted(devices.items())]
    total = _totals(segs)

    sites: dict[str, dict] = {}
    for s in data["segments"]:
        for b in s.get("blocks", []):
            if b["state"] != "active_allocated":
                continue
            si = site_of(b.get("frames"))
            e = sites.setdefault(si["site"], {**si, "bytes": 0, "blocks": 0})
            e["bytes"] += b["size"]
            e["blocks"] += 1
    top_sites = sorted(sites.values(), key=lambda e: (-e["bytes"], e["site"]))[:max(top, 0)]
    for e in top_sites:
        e["allocated_bytes"] = e.pop("bytes")

    traces = data.get("device_traces", [])
    actions: dict[str, int] = {}
    for dev in traces:
        for t in dev:
            actions[t["action"]] = actions.get(t["action"], 0) + 1
    ooms = _oom_events(traces)
    oom = dict(ooms[-1], count=len(ooms)) if ooms else None

    notes: list[str] = []
    settings = data.get("allocator_settings")
    expandable = bool(isinstance(settings, dict) and settings.get("expandable_segments")) or \
        any(s["is_expandable"] for s in segs)
    if oom is not None:
        need = oom["requested_bytes"] or 0
        dev_tot = next((d for d in per_device if d["device"] == oom["device"]), total)
        if need <= dev_tot["free_bytes"] and need > dev_tot["largest_free_block_bytes"]:
            notes.append("fragmentation: the failed request would fit in the reserved-but-free memory "
                         "but not in any one free block"
                         + ("" if expandable else " — try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
        elif need > dev_tot["free_bytes"] + (oom["device_free_bytes"] or 0):
            notes.append("capacity: the failed request is larger than all free memory (cached and on the device): "
                         "a sizing problem, not fragmentation")
        notes.append("the snapshot was taken after the OOM: memory freed in between is not shown as in use")
    if not traces or not any(traces):
        notes.append("no allocation history (device_traces empty): record it with "
                     "torch.cuda.memory._record_memory_history() before the failure")
    out = {
        "source": source,
        "keys": sorted(str(k) for k in data),
        "total": total,
        "devices": per_device,
        "segments": sorted(segs, key=lambda s: (s["device"], -s["free_bytes"], s["address"])),
        "oom": oom,
        "oom_events": ooms,
        "top_sites": top_sites,
        "trace_actions": dict(sorted(actions.items())),
        "expandable_segments": expandable,
        "notes": notes,
    }
    if isinstance(settings, dict):
        out["allocator_settings"] = {str(k): v for k, v in settings.items()
                                     if isinstance(v, (str, int, float, bool)) or v is None}
    return out


def analyze_snapshot(path: str | Path, top: int = TOP_SITES) -> dict:
    """Load (safely) and analyse a snapshot file: the dict ``oomdoctor snapshot --json`` prints.

    Raises BadInput (exit 2) for anything that is not a plain-data memory snapshot.
    """
    return analyze(load_snapshot(path), top=top, source=str(path))


# ----------------------------------------------------------------------------- text
def render_text(report: dict, max_segments: int = 8) -> str:
    from oomdoctor.units import human_bytes as hb

    lines = [f"memory snapshot: {report.get('source') or '-'}"]
    hdr = f"{'device':>6}  {'segments':>8}  {'reserved':>12}  {'allocated':>12}  {'unallocated':>12}  " \
          f"{'largest free':>12}  {'fragmentation':>13}"
    lines.append(hdr)
    rows = list(report["devices"])
    if len(rows) != 1:
        rows.append({"device": "all", **report["total"]})
    for d in rows:
        lines.append(f"{d['device']!s:>6}  {d['segments']:>8}  {hb(d['reserved_bytes']):>12}  "
                     f"{hb(d['allocated_bytes']):>12}  {hb(d['reserved_unallocated_bytes']):>12}  "
                     f"{hb(d['largest_free_block_bytes']):>12}  {d['fragmentation'] * 100:>12.1f}%")
    frag = [s for s in report["segments"] if s["free_bytes"]][:max_segments]
    if frag:
        lines.append("")
        lines.append("segments with free blocks (most free first):")
        for s in frag:
            lines.append(f"  dev {s['device']} 0x{s['address']:x} {s['segment_type'] or '?':<5} "
                         f"size {hb(s['total_size_bytes'])}, allocated {hb(s['allocated_bytes'])}, "
                         f"free {hb(s['free_bytes'])} in {s['free_blocks']} block(s), "
                         f"largest {hb(s['largest_free_block_bytes'])}")
    oom = report.get("oom")
    lines.append("")
    if oom:
        more = f" ({oom['count']} OOM events, the last shown)" if oom["count"] > 1 else ""
        lines.append(f"OOM on device {oom['device']}{more}: tried to allocate {hb(oom['requested_bytes'])} "
                     f"({oom['requested_bytes']} B) with {hb(oom['device_free_bytes'])} free on the device; "
                     f"at {oom['site']}")
    else:
        lines.append("no OOM event in the recorded history")
    if report["top_sites"]:
        lines.append("")
        lines.append("top allocation sites (active blocks, innermost frame outside torch):")
        for e in report["top_sites"]:
            lines.append(f"  {hb(e['allocated_bytes']):>12}  {e['blocks']:>5} block(s)  {e['site']}")
    for n in report["notes"]:
        lines.append(f"note: {n}")
    return "\n".join(lines)
