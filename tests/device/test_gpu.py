"""On a real NVIDIA GPU (marked `gpu`, skipped without NVML): device state, the ballast, and a retest whose
emulated free memory is held by a real ballast and given back by process group.

Run on the lent H200 with `python -m pytest -q -m gpu tests/device/test_gpu.py` (needs torch for the ballast)."""
from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from oomdoctor.device import nvml as devmod

ROOT = Path(__file__).resolve().parents[2]
FX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
GiB = 1 << 30

_state = devmod.capture()
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(_state.get("status") != "captured",
                                 reason=f"no GPU: NVML {_state.get('status')} ({_state.get('reason', '')})")]
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the ballast needs torch")


def _free(i: int = 0) -> int:
    st = devmod.capture(with_processes=False)
    return next(g["free_bytes"] for g in st["gpus"] if g["index"] == i)


def test_nvml_state_lists_every_gpu_and_its_holders() -> None:
    st = devmod.capture()
    assert st["status"] == "captured" and st["gpus"]
    for g in st["gpus"]:
        assert 0 < g["free_bytes"] <= g["total_bytes"] and g["used_bytes"] <= g["total_bytes"]
        assert isinstance(g.get("processes"), list)
    print("GPUs:", [(g["index"], g["name"], g["total_bytes"], g["free_bytes"]) for g in st["gpus"]])


@needs_torch
def test_ballast_leaves_the_target_free_and_gives_it_back(tmp_path: Path) -> None:
    from oomdoctor.retest.procs import Group, wait_memory_back

    before = _free()
    target = before - 4 * GiB
    ready = tmp_path / "ready.json"
    g = Group([sys.executable, "-m", "oomdoctor.retest.ballast", str(target), str(ready), "--index", "0"], tmp_path / "b.log",
              env=dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="0"))
    try:
        t0 = time.time()
        while not ready.exists() and time.time() - t0 < 120:
            assert g.proc.poll() is None, (tmp_path / "b.log").read_text()
            time.sleep(0.2)
        held = _free()
        assert abs(held - target) < 256 << 20, (held, target)
    finally:
        g.stop()
    ok, last = wait_memory_back(before, _free, timeout_s=60)
    assert ok, (before, last)
    print(f"ballast: free {before} → {held} (target {target}) → back to {last}")


@needs_torch
def test_retest_with_emulated_free_memory_gives_everything_back(tmp_path: Path) -> None:
    """A real ballast (emulated 24 GiB card) + the fake engine tree: the attempt records the ballast, and after the
    retest NVML shows the memory back."""
    import subprocess

    from oomdoctor.card import store as cardmod

    card = tmp_path / "a.yaml"
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "diagnose", str(FX / "A_fail.log"), "--out", str(card)],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    d = cardmod.load_dict(card)
    pids = tmp_path / "pids.txt"
    d["workload"].update(launcher="command", engine_args={}, base_args={}, argv=[
        sys.executable, str(ROOT / "tests" / "fake_engine.py"), "--pids", str(pids), "--fail-log", str(FX / "A_fail.log"),
        "--pass-log", str(FX / "A_pass.log"), "--threshold", "2000000"])
    cardmod.save(d, card)
    before = _free()
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "retest", str(card), "--engine", "real", "--emulate", "rtx4090",
                        "--trust-card"],
                       capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    a = cardmod.load_dict(card)["attempts"][-1]
    assert a["outcome"] == "pass" and a["target_device"] == "rtx4090"
    assert a["ballast"]["held_bytes"] > 100 * GiB and abs(a["ballast"]["nvml_free"] - 24 * GiB) < 256 << 20
    after = _free()
    assert after > before - (512 << 20), (before, after)
    print(f"retest with a 24 GiB emulation: ballast held {a['ballast']['held_bytes']} B; free before {before}, after {after}")
