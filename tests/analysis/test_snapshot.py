"""oomdoctor snapshot: a torch memory snapshot read safely, without torch.

The snapshots here are BUILT from plain dicts in the format torch writes with
``torch.cuda.memory._dump_snapshot(path)`` = ``pickle.dump(torch.cuda.memory._snapshot(), f)``.
Format source: the ``_snapshot`` docstring in torch/cuda/memory.py (Segment / Block / Frame /
TraceEntry TypedDicts) and ``_memory_snapshot`` in torch/csrc/cuda/Module.cpp, which emits the
block state string 'active_pending_free', 'device_free' instead of 'addr' for 'oom' entries,
'segment_pool_id' as a tuple, and (newer torch) 'allocator_settings' / 'external_annotations'.
Frames are innermost first. With stacks='all' (the default of _record_memory_history) a real torch
2.11 snapshot from an H200 (tools/gpu/make_snapshot.py) lists the C++ frames first ('??',
'CUDACachingAllocator.cpp', '' ...), the innermost Python frame spliced in among the interpreter's C
frames, then the outer Python frames: ``fr`` below builds stacks in that order.
"""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from oomdoctor.cli import main
from oomdoctor.errors import BadInput
from oomdoctor.analysis.snapshot import NO_STACK, analyze_snapshot, load_snapshot, render_text, site_of

MiB = 1 << 20
GiB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "fixtures" / "snapshots" / "h200_oom.pickle"

CXX = {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"}
CXX2 = {"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "c10::cuda::CUDACachingAllocator::Native::malloc"}
CXX3 = {"filename": "", "line": 0, "name": "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate"}
PYC = {"filename": "??", "line": 0, "name": "_PyEval_EvalFrameDefault"}
TORCH = {"filename": "/usr/lib/python3.12/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"}


def fr(fn, line, name):
    """A stack as torch 2.11 records it with stacks='all' (see the module docstring)."""
    return [CXX, CXX2, CXX3, TORCH, PYC, {"filename": fn, "line": line, "name": name}, PYC,
            {"filename": "??", "line": 0, "name": "_start"}, {"filename": "/app/main.py", "line": 9, "name": "<module>"}]


W = fr("/app/model.py", 42, "load_weights")
KV = fr("/app/kv.py", 17, "alloc_kv")
SMALL = fr("/app/util.py", 3, "tiny")


def block(addr, size, state, frames=(), req=None):
    return {"address": addr, "size": size, "requested_size": size if req is None else req, "state": state,
            "frames": list(frames)}


def segment(device, addr, blocks, seg_type="large"):
    alloc = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": device, "address": addr, "total_size": sum(b["size"] for b in blocks),
            "allocated_size": alloc, "active_size": active,
            "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
            "stream": 0, "segment_type": seg_type, "segment_pool_id": (0, 0), "is_expandable": False,
            "frames": [], "blocks": blocks}


def snapshot_dict(with_oom=True, new_keys=True):
    a = 0x7F0000000000
    seg1 = segment(0, a, [block(a, 256 * MiB, "active_allocated", W),
                          block(a + 256 * MiB, 128 * MiB, "inactive"),
                          block(a + 384 * MiB, 512 * MiB, "active_allocated", KV),
                          block(a + 896 * MiB, 128 * MiB, "inactive")])
    b = 0x7F1000000000
    seg2 = segment(0, b, [block(b, 512, "active_allocated", SMALL, req=500),
                          block(b + 512, 2 * MiB - 512, "inactive")], "small")
    c = 0x7F2000000000
    seg3 = segment(1, c, [block(c, 320 * MiB, "active_allocated", W),
                          block(c + 320 * MiB, 192 * MiB, "active_pending_free", KV)])
    traces0 = [
        {"action": "segment_alloc", "addr": a, "size": GiB, "stream": 0, "frames": W, "time_us": 1},
        {"action": "alloc", "addr": a, "size": 256 * MiB, "stream": 0, "frames": W, "time_us": 2},
        {"action": "alloc", "addr": a + 384 * MiB, "size": 512 * MiB, "stream": 0, "frames": KV, "time_us": 3},
        {"action": "free_requested", "addr": a + 256 * MiB, "size": 128 * MiB, "stream": 0, "frames": KV, "time_us": 4},
        {"action": "free_completed", "addr": a + 256 * MiB, "size": 128 * MiB, "stream": 0, "frames": KV, "time_us": 5},
    ]
    if with_oom:
        traces0.append({"action": "oom", "device_free": 64 * MiB, "size": 200 * MiB, "stream": 0,
                        "frames": fr("/app/serve.py", 88, "too_large"), "time_us": 6})
    d = {"segments": [seg1, seg2, seg3], "device_traces": [traces0, []]}
    if new_keys:
        d["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                   "garbage_collection_threshold": 0.0, "expandable_segments": False,
                                   "pinned_num_register_threads": 1}
        d["external_annotations"] = []
    return d


def write(tmp_path, obj, name="snap.pickle", protocol=pickle.DEFAULT_PROTOCOL):
    p = tmp_path / name
    p.write_bytes(pickle.dumps(obj, protocol=protocol))
    return p


def run(args, capsys):
    with pytest.raises(SystemExit) as ex:
        main(args)
    out, err = capsys.readouterr()
    return ex.value.code, out, err


def all_bytes_fields_are_ints(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k.endswith("_bytes") and v is not None:
                assert isinstance(v, int) and not isinstance(v, bool), (k, v)
            all_bytes_fields_are_ints(v)
    elif isinstance(obj, list):
        for v in obj:
            all_bytes_fields_are_ints(v)


# ----------------------------------------------------------------------------- real-shaped data loads
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_real_shaped_snapshot_loads_with_every_protocol(tmp_path, protocol):
    d = snapshot_dict()
    assert load_snapshot(write(tmp_path, d, protocol=protocol)) == d


def test_numbers(tmp_path):
    r = analyze_snapshot(write(tmp_path, snapshot_dict()))
    dev0, dev1 = r["devices"]
    assert dev0["device"] == 0 and dev1["device"] == 1
    assert dev0["reserved_bytes"] == GiB + 2 * MiB
    assert dev0["allocated_bytes"] == 768 * MiB + 512
    assert dev0["reserved_unallocated_bytes"] == 256 * MiB + 2 * MiB - 512
    assert dev0["free_bytes"] == 256 * MiB + 2 * MiB - 512
    assert dev0["largest_free_block_bytes"] == 128 * MiB
    assert dev0["fragmentation"] == pytest.approx(1 - (128 * MiB) / (258 * MiB - 512), abs=1e-6)
    # device 1: a pending-free block is not allocated, not free either
    assert dev1["reserved_bytes"] == 512 * MiB and dev1["allocated_bytes"] == 320 * MiB
    assert dev1["active_bytes"] == 512 * MiB and dev1["free_bytes"] == 0 and dev1["fragmentation"] == 0.0
    t = r["total"]
    assert t["reserved_bytes"] == GiB + 2 * MiB + 512 * MiB
    assert t["allocated_bytes"] == 768 * MiB + 512 + 320 * MiB
    assert t["allocated_bytes"] <= t["reserved_bytes"]
    assert t["segments"] == 3
    # per segment: the largest free block
    seg1 = next(s for s in r["segments"] if s["address"] == 0x7F0000000000)
    assert seg1["largest_free_block_bytes"] == 128 * MiB and seg1["free_blocks"] == 2


def test_oom_event_and_fragmentation_verdict(tmp_path):
    r = analyze_snapshot(write(tmp_path, snapshot_dict()))
    oom = r["oom"]
    assert oom["requested_bytes"] == 200 * MiB and oom["device_free_bytes"] == 64 * MiB
    assert oom["device"] == 0 and oom["count"] == 1
    assert oom["site"] == "/app/serve.py:88 too_large"
    # 200 MiB <= 258 MiB cached free, > 128 MiB largest block: fragmentation
    assert any(n.startswith("fragmentation") and "expandable_segments" in n for n in r["notes"])
    assert r["trace_actions"]["oom"] == 1 and r["trace_actions"]["alloc"] == 2


def test_no_oom(tmp_path):
    r = analyze_snapshot(write(tmp_path, snapshot_dict(with_oom=False, new_keys=False)))
    assert r["oom"] is None and r["oom_events"] == []
    assert "no OOM event" in render_text(r)


def test_top_sites_skip_torch_and_native_frames(tmp_path):
    r = analyze_snapshot(write(tmp_path, snapshot_dict()), top=2)
    assert [s["site"] for s in r["top_sites"]] == ["/app/model.py:42 load_weights", "/app/kv.py:17 alloc_kv"]
    assert r["top_sites"][0]["allocated_bytes"] == 576 * MiB and r["top_sites"][0]["blocks"] == 2
    # the pending-free 192 MiB block of alloc_kv on device 1 is not counted as allocated
    assert r["top_sites"][1]["allocated_bytes"] == 512 * MiB and r["top_sites"][1]["blocks"] == 1
    assert site_of([])["site"] == NO_STACK
    assert site_of([CXX, TORCH])["site"].startswith("(inside torch)")


def test_cli_json(tmp_path, capsys):
    p = write(tmp_path, snapshot_dict())
    rc, out, err = run(["snapshot", str(p), "--json", "--top", "1"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["total"]["reserved_bytes"] == GiB + 2 * MiB + 512 * MiB
    assert len(d["top_sites"]) == 1
    all_bytes_fields_are_ints(d)


def test_cli_text(tmp_path, capsys):
    rc, out, err = run(["snapshot", str(write(tmp_path, snapshot_dict()))], capsys)
    assert rc == 0, err
    assert "fragmentation" in out and "OOM on device 0" in out and "200.00 MiB" in out
    assert "/app/model.py:42 load_weights" in out


# ----------------------------------------------------------------------------- refusals
class Evil:
    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def test_pickle_importing_os_system_is_refused_and_nothing_runs(tmp_path, capsys):
    marker = tmp_path / "pwned"
    p = tmp_path / "evil.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "x": Evil(f"echo pwned > {marker}")}))
    rc, out, err = run(["snapshot", str(p)], capsys)
    assert rc == 2
    assert "refused" in err and "system" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()
    with pytest.raises(BadInput, match=r"(posix|os)\.system"):
        load_snapshot(p)
    assert not marker.exists()


def test_pickle_of_any_class_is_refused(tmp_path):
    p = tmp_path / "cls.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "p": Path("/x")}))
    with pytest.raises(BadInput, match="pathlib"):
        load_snapshot(p)


def test_list_is_refused(tmp_path, capsys):
    rc, out, err = run(["snapshot", str(write(tmp_path, snapshot_dict()["segments"]))], capsys)
    assert rc == 2 and "segments" in err and "list" in err


def test_dict_without_segments_is_refused(tmp_path, capsys):
    rc, out, err = run(["snapshot", str(write(tmp_path, {"device_traces": []}))], capsys)
    assert rc == 2 and "'segments'" in err and "missing" in err


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.__setitem__("segments", {}), "'segments'"),
    (lambda d: d["segments"][0].__setitem__("total_size", "1 GiB"), "segments[0].total_size"),
    (lambda d: d["segments"][0].pop("address"), "segments[0].address"),
    (lambda d: d["segments"][1]["blocks"][0].__setitem__("state", "weird"), "segments[1].blocks[0].state"),
    (lambda d: d["segments"][1]["blocks"][0].pop("size"), "segments[1].blocks[0].size"),
    (lambda d: d["segments"][0].__setitem__("blocks", None), "segments[0].blocks"),
    (lambda d: d["device_traces"][0][0].pop("action"), "device_traces[0][0].action"),
    (lambda d: d.__setitem__("device_traces", "x"), "'device_traces'"),
])
def test_wrong_types_name_the_field(tmp_path, capsys, mutate, field):
    d = snapshot_dict()
    mutate(d)
    rc, out, err = run(["snapshot", str(write(tmp_path, d))], capsys)
    assert rc == 2 and field in err, err


@pytest.mark.parametrize("content", [b"", b"this is a log line\n", b"\x80\x04garbage", b"\x1f\x8b\x08\x00"])
def test_non_pickle_is_refused(tmp_path, capsys, content):
    p = tmp_path / "bad.pickle"
    p.write_bytes(content)
    rc, out, err = run(["snapshot", str(p)], capsys)
    assert rc == 2 and err.startswith("oomdoctor: error:") and len(err.strip().splitlines()) == 1


def test_missing_file(tmp_path, capsys):
    rc, out, err = run(["snapshot", str(tmp_path / "nope.pickle")], capsys)
    assert rc == 2


# ----------------------------------------------------------------------------- the real one (added later)
@pytest.mark.skipif(not REAL.exists(), reason="fixtures/snapshots/h200_oom.pickle not captured yet "
                                              "(tools/gpu/make_snapshot.py on an H200)")
def test_real_h200_snapshot():
    r = analyze_snapshot(REAL)
    assert r["oom"] is not None and r["oom"]["requested_bytes"] > 0
    assert 0 < r["total"]["allocated_bytes"] <= r["total"]["reserved_bytes"]
    all_bytes_fields_are_ints(r)
