"""Pickles from strangers: a 12-byte memo bomb, a 6 KB shared-reference pickle, a 10,000-digit size, deep nesting
and lengths past the end of the file all end fast in exit 2 with one line — before the C unpickler allocates a memo
table of billions of slots, and before any walker expands the shared references."""
from __future__ import annotations

import copy
import pickle
import time
import pytest

from conftest import ROOT, invoke
from oomdoctor.analysis.pickleguard import scan_opcodes
from oomdoctor.analysis.snapshot import load_snapshot
from oomdoctor.errors import BadInput

REAL = ROOT / "fixtures" / "snapshots" / "h200_oom.pickle"


def _shared_bomb() -> bytes:
    """A snapshot of the right shape whose lists hold one segment, block and frame hundreds of times each: 600**3
    frames to validate once expanded, in under 6 KB (the pickle memo stores each object once)."""
    frame = {"filename": "model.py", "line": 1, "name": "forward"}
    block = {"size": 512, "state": "active_allocated", "frames": [frame] * 600}
    seg = {"address": 0, "total_size": 1 << 20, "blocks": [block] * 600}
    data = pickle.dumps({"segments": [seg] * 600, "device_traces": []}, protocol=4)
    assert len(data) < 6 * 1024
    return data


def _segment_with(size) -> bytes:
    d = pickle.loads(REAL.read_bytes())
    d = copy.deepcopy(d)
    d["segments"][0]["total_size"] = size
    return pickle.dumps(d, protocol=4)


CASES = {
    "memo_bomb": (b"\x80\x04K\x01" + b"r\xff\xff\xff\x7f" + b"0N.", "memo bomb"),      # 12 bytes
    "memo_put_text": (b"\x80\x02Np99999999999\n.", "memo bomb"),
    "shared_refs": (_shared_bomb(), "expands to more than"),
    "huge_int": (_segment_with(10 ** 10000), "bits"),
    "deep": (pickle.dumps({"segments": eval("[" * 200 + "]" * 200)}, protocol=4), "nests deeper"),
    "long_string": (b"\x80\x04X\xff\xff\xff\x7fabc.", "past the end"),
    "no_stop": (pickle.dumps({"segments": []}, protocol=4)[:-1], "STOP"),
}
assert len(CASES["memo_bomb"][0]) == 12


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_pickle_is_one_line_exit_2_and_fast(tmp_path, name):
    data, why = CASES[name]
    p = tmp_path / f"{name}.pickle"
    p.write_bytes(data)
    t0 = time.perf_counter()
    r = invoke("snapshot", p)
    assert r.rc == 2 and len(r.err.splitlines()) == 1 and r.err.startswith("oomdoctor: error:"), r.err
    assert why in r.err, r.err
    assert time.perf_counter() - t0 < 30
    with pytest.raises(BadInput, match=why):
        load_snapshot(p)


def test_diagnose_with_a_hostile_snapshot_is_exit_2(tmp_path):
    p = tmp_path / "bomb.pickle"
    p.write_bytes(CASES["memo_bomb"][0])
    r = invoke("diagnose", ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200" / "A_fail.log", "--no-device",
               "--no-card", "--snapshot", p)
    assert r.rc == 2 and "memo bomb" in r.err and len(r.err.splitlines()) == 1


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))   # 0 and 1 have no header
def test_real_snapshot_passes_the_opcode_pass_in_every_protocol(tmp_path, protocol):
    data = pickle.dumps(pickle.loads(REAL.read_bytes()), protocol=protocol)
    scan_opcodes(data, "real")
    p = tmp_path / "real.pickle"
    p.write_bytes(data)
    assert load_snapshot(p)["segments"] == pickle.loads(REAL.read_bytes())["segments"]
