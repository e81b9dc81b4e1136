"""A run that failed for a reason that is not the lever's is `inconclusive` (exit 3): an import error, a crash
before the phase the original failure reached, a timeout before any phase. It records the error and its evidence,
does not count as a tried lever, keeps no change, proposes no next lever and stops the walk with one line saying
what to fix. The fake engine (tests/fake_engine.py) replays the real vLLM 0.25.1 H200 logs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from oomdoctor.card import store as cardmod

ROOT = Path(__file__).resolve().parents[2]
FX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
FAKE = ROOT / "tests" / "fake_engine.py"
ONE_H200 = {"status": "captured", "reason": "", "source": "nvml", "gpus": [
    {"index": 0, "name": "NVIDIA H200", "total_bytes": 150754820096, "free_bytes": 150109880320, "used_bytes": 0,
     "processes": []}]}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, OOMDOCTOR_NO_NVML="1", PYTHONPATH=str(ROOT))
    e.pop("VLLM_USE_FLASHINFER_SAMPLER", None)
    if args and args[0] == "retest":      # the test's own fake-engine card: its command line is trusted
        args = (*args, "--trust-card")
    return subprocess.run([sys.executable, "-m", "oomdoctor", *args], capture_output=True, text=True, env=e, cwd=ROOT,
                          timeout=120)


def fake_card(tmp_path: Path, *fake_args: str, drop_env: bool = False, log: str = "A_fail.log") -> Path:
    """A card diagnosed from the real log, its workload's engine replaced by the fake one (same env, same levers)."""
    card = tmp_path / "card.yaml"
    r = run_cli("diagnose", str(FX / log), "--out", str(card), "--no-device")
    assert r.returncode == 0, r.stderr
    d = yaml.safe_load(card.read_text())
    argv = [sys.executable, str(FAKE), "--pids", str(tmp_path / "pids.txt"), "--fail-log", str(FX / log),
            "--pass-log", str(FX / "A_pass.log"), "--threshold", "2000000", *fake_args]
    d["workload"].update(launcher="command", argv=argv, engine_args={}, base_args={})
    d["workload"].pop("free_at_start_bytes", None)
    if drop_env:                                  # the run started without the env the log names
        d["workload"]["env"] = {k: v for k, v in d["workload"]["env"].items() if k != "VLLM_USE_FLASHINFER_SAMPLER"}
    cardmod.save(d, card)
    return card


def assert_untried(card: Path, levers_before: list) -> dict:
    """The inconclusive attempt left the lever list and the walk as they were; returns the attempt."""
    after = cardmod.load_dict(card)
    a = after["attempts"][-1]
    assert a["outcome"] == "inconclusive" and a["next_lever"] is None
    assert a["inconclusive"]["reason"] and a["inconclusive"]["fix"]
    assert after["levers"] == levers_before
    r = run_cli("retest", str(card), "--next", "--dry-run", "--engine", "real", "--json")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["lever"] == levers_before[0]["id"]      # --next picks the same lever again
    return a


@pytest.mark.slow
def test_import_error_is_inconclusive_and_names_the_env_to_set(tmp_path: Path) -> None:
    card = fake_card(tmp_path, "--require-env", "VLLM_USE_FLASHINFER_SAMPLER=0", drop_env=True)
    levers = cardmod.load_dict(card)["levers"]
    r = run_cli("retest", str(card), "--engine", "real")
    assert r.returncode == 3, r.stderr
    a = assert_untried(card, levers)
    assert "No module named 'flashinfer'" in a["inconclusive"]["reason"]
    assert "before kv_reservation" in a["inconclusive"]["reason"]
    assert "VLLM_USE_FLASHINFER_SAMPLER=0 (log line 31)" in a["inconclusive"]["fix"]
    assert any("flashinfer" in e["text"] for e in a["inconclusive"]["evidence"])
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("inconclusive: ")]
    assert len(lines) == 1 and "fix:" in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_the_env_the_log_names_reaches_the_engine(tmp_path: Path) -> None:
    card = fake_card(tmp_path, "--require-env", "VLLM_USE_FLASHINFER_SAMPLER=0")      # the card as diagnosed
    r = run_cli("retest", str(card), "--engine", "real")
    assert r.returncode == 0, r.stderr
    assert cardmod.load_dict(card)["attempts"][-1]["outcome"] == "pass"


@pytest.mark.slow
def test_crash_before_the_original_phase_is_inconclusive(tmp_path: Path) -> None:
    card = fake_card(tmp_path, "--crash-after", "20")
    levers = cardmod.load_dict(card)["levers"]
    r = run_cli("retest", str(card), "--engine", "real")
    assert r.returncode == 3, r.stderr
    a = assert_untried(card, levers)
    assert "before kv_reservation where the original failure happened" in a["inconclusive"]["reason"]
    assert a["classification"]["class"] == "unknown"


@pytest.mark.slow
def test_timeout_before_any_phase_is_inconclusive(tmp_path: Path) -> None:
    card = fake_card(tmp_path, "--hang-after", "0")
    levers = cardmod.load_dict(card)["levers"]
    r = run_cli("retest", str(card), "--engine", "real", "--timeout", "4")
    assert r.returncode == 3, r.stderr
    a = assert_untried(card, levers)
    assert "before the engine reached any start-up phase" in a["inconclusive"]["reason"]


@pytest.mark.slow
def test_inconclusive_attempt_keeps_no_change(tmp_path: Path) -> None:
    """An inconclusive run of lever 1, then the walk resumes: lever 1 again, without a 'kept' change from before."""
    card = fake_card(tmp_path, "--crash-after", "20")
    assert run_cli("retest", str(card), "--engine", "real").returncode == 3
    d = cardmod.load_dict(card)
    d["attempts"][-1]["signature_gone"] = True        # even when the crash came after the original phase
    cardmod.save(d, card)
    r = run_cli("retest", str(card), "--engine", "real", "--dry-run", "--json")
    assert "kept from an earlier attempt" not in " ".join(yaml.safe_load(r.stdout)["description"])


@pytest.mark.slow
def test_lever_needing_two_gpus_on_a_one_gpu_card_is_never_run(tmp_path: Path) -> None:
    card = fake_card(tmp_path)
    d = cardmod.load_dict(card)
    d["device"] = ONE_H200
    cardmod.save(d, card)
    ids = [lv["id"] for lv in d["levers"]]
    assert "tensor_parallel_size" in ids
    r = run_cli("retest", str(card), "--engine", "real", "--lever", "tensor_parallel_size")
    assert r.returncode == 2 and "needs other hardware: 2 GPUs (TP 2 x PP 1 x DP 1)" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("oomdoctor: error:")
    assert "the recorded device has 1 (NVIDIA H200)" in r.stderr
    assert not (tmp_path / "pids.txt").exists() and not cardmod.load_dict(card).get("attempts")
    # the walk: every lever before it tried, --next steps over it to the next one the device can apply
    tp_at = ids.index("tensor_parallel_size")
    d["attempts"] = [{"n": i + 1, "at": "2026-12-01T00:00:00Z", "lever": lv["id"], "change": lv["change"],
                      "outcome": "fail", "engine": {"name": "vllm", "mode": "real"},
                      "config_fingerprint": "sha256:" + "0" * 64} for i, lv in enumerate(d["levers"][:tp_at])]
    cardmod.save(d, card)
    r = run_cli("retest", str(card), "--engine", "real", "--next", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["lever"] == ids[tp_at + 1]
    assert "never run here (needs other hardware): tensor_parallel_size — 2 GPUs" in r.stderr
    assert not (tmp_path / "pids.txt").exists()


@pytest.mark.slow
def test_confirmed_follow_up_is_recorded(tmp_path: Path) -> None:
    """The flagless B start: utilization 0.27 is expected to pass the check and then hit the 4,000,000-token window.
    The fake engine replays the real A_fail log (that very kv_capacity failure) for it: the chain is confirmed."""
    from tests.levers.test_chain_and_hardware import MODEL, flagless_b

    card = tmp_path / "b.yaml"
    assert run_cli("diagnose", str(flagless_b(tmp_path)), "--out", str(card), "--no-device", "--model",
                   str(MODEL)).returncode == 0
    d = yaml.safe_load(card.read_text())
    assert d["levers"][0]["id"] == "gpu_memory_utilization"
    d["workload"].update(launcher="command", engine_args={}, base_args={}, argv=[
        sys.executable, str(FAKE), "--pids", str(tmp_path / "pids.txt"), "--fail-log", str(FX / "A_fail.log"),
        "--pass-log", str(FX / "A_pass.log")])
    d["workload"].pop("free_at_start_bytes", None)
    cardmod.save(d, card)
    r = run_cli("retest", str(card), "--engine", "real", "--no-emulate")     # no ballast on a CPU machine
    assert r.returncode == 1, r.stderr
    assert "expected: gpu_memory_utilization 0.27 passes the start-up check; then kv_capacity" in r.stderr
    a = cardmod.load_dict(card)["attempts"][-1]
    assert a["outcome"] == "fail" and a["classification"]["class"] == "kv_capacity"
    assert a["chain_check"] == {"expected": "kv_capacity", "observed": "kv_capacity", "status": "confirmed"}
    assert a["next_lever"]["id"] == "max_model_len"
    assert "chain: expected kv_capacity, observed kv_capacity: confirmed" in r.stderr


@pytest.mark.slow
def test_twin_is_a_prediction_and_the_gate_never_takes_it(tmp_path: Path) -> None:
    from oomdoctor.card.receipt import FoundAttempt
    from oomdoctor.gate.verdict import _AnySignature, _exact_verdict

    card = fake_card(tmp_path)
    r = run_cli("retest", str(card), "--engine", "twin")
    assert r.returncode == 4, r.stderr
    a = cardmod.load_dict(card)["attempts"][-1]
    assert a["outcome"] == "predicted_pass" and a["engine"]["mode"] == "twin"
    found = FoundAttempt(card, "card", dict(a), a["config_fingerprint"], a["effective_config"])
    assert not found.is_passing(None)
    v = _exact_verdict([found], ["nvidia-h200"], None, _AnySignature())
    assert v[0] == "fail" and "predicted_pass" in v[2]
    assert not (tmp_path / "pids.txt").exists()


@pytest.mark.slow
def test_twin_follows_the_chain(tmp_path: Path) -> None:
    """The lever's own check passes, but the chain expects the window failure next: the twin predicts a failure."""
    from tests.levers.test_chain_and_hardware import MODEL, flagless_b

    card = tmp_path / "b.yaml"
    assert run_cli("diagnose", str(flagless_b(tmp_path)), "--out", str(card), "--no-device", "--model",
                   str(MODEL)).returncode == 0
    r = run_cli("retest", str(card), "--engine", "twin")
    assert r.returncode == 4, r.stderr
    a = cardmod.load_dict(card)["attempts"][-1]
    assert a["lever"] == "gpu_memory_utilization" and a["outcome"] == "predicted_fail"
    assert any("the chain predicts kv_capacity after this lever" in n for n in a["notes"])


@pytest.mark.slow
@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_real_runner_without_the_engine_is_inconclusive(tmp_path: Path) -> None:
    """The card exactly as diagnosed from the real log (launcher vllm-llm, oomdoctor's own engine runner) on a machine
    without vLLM: the engine cannot even be imported. That is no verdict on the lever."""
    card = tmp_path / "a.yaml"
    assert run_cli("diagnose", str(FX / "A_fail.log"), "--out", str(card), "--no-device").returncode == 0
    levers = cardmod.load_dict(card)["levers"]
    r = run_cli("retest", str(card), "--engine", "real", "--no-emulate")
    assert r.returncode == 3, r.stderr
    a = assert_untried(card, levers)
    assert "No module named 'vllm'" in a["inconclusive"]["reason"]
    assert a["inconclusive"]["fix"] == ("install 'vllm' into the engine's Python, or give the card's workload.env what "
                                        "the original run had")


@pytest.mark.slow
def test_a_secret_in_the_error_line_never_reaches_the_output(tmp_path: Path) -> None:
    token = "hf_" + "Q" * 34
    card = fake_card(tmp_path, "--fail-with", f"OSError: 401 Client Error for /root/model (token {token})")
    r = run_cli("retest", str(card), "--engine", "real", "--json")
    assert r.returncode == 3, r.stderr
    assert "OSError: 401 Client Error" in r.stderr
    assert token not in r.stdout and token not in r.stderr and token not in card.read_text()
