"""diagnose --model: the memory model checks the recorded config against the real log and predicts each lever."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
LLAMA = ROOT / "fixtures" / "models" / "gpukit-llama-886m"


def test_kv_capacity_agrees_and_the_window_lever_fits(cli, tmp_path) -> None:
    r = cli("diagnose", FX / "A_fail.log", "--no-device", "--model", LLAMA, "--json", "--out", tmp_path / "a.yaml")
    assert r.rc == 0, r.err
    d = r.json()
    mc = d["model_check"]
    assert mc["recorded_config"]["fits"] is False and mc["recorded_config"]["failure"] == "kv_capacity"
    assert mc["agrees_with_log"] is True
    first = d["levers"][0]
    assert first["id"] == "max_model_len" and first["predicted"]["model"]["fits"] is True
    util = [lv for lv in d["levers"] if lv["id"] == "gpu_memory_utilization"]
    assert all(lv["predicted"]["model"]["fits"] is False for lv in util)   # 0.97 cannot hold 244 GiB either


def test_free_memory_check_agrees(cli, tmp_path) -> None:
    r = cli("diagnose", FX / "B_fail.log", "--no-device", "--model", LLAMA, "--json", "--out", tmp_path / "b.yaml")
    d = r.json()
    assert d["model_check"]["recorded_config"]["failure"] == "free_memory_below_utilization"
    assert d["levers"][0]["id"] == "gpu_memory_utilization" and d["levers"][0]["predicted"]["model"]["fits"] is True


def test_unknown_gpu_size_is_bad_input(cli, tmp_path) -> None:
    log = tmp_path / "a.log"
    log.write_text("\n".join(ln for ln in (FX / "A_fail.log").read_text().splitlines() if not ln.startswith("# ")))
    r = cli("diagnose", log, "--no-device", "--model", LLAMA, "--out", tmp_path / "c.yaml")
    assert r.rc == 2 and "--gpu-memory" in r.err


def test_nvml_holders_name_the_process_to_stop() -> None:
    """One busy card: the log only says free < requested; NVML (same machine) names the holder → lever #1."""
    from oomdoctor.levers.engine import propose

    nums = {"free_at_start_bytes": 42402064630, "gpu_total_bytes": 150109106995, "gpu_memory_utilization": 0.92,
            "requested_bytes": 138104673403}
    dev = {"status": "captured", "gpus": [
        {"index": 0, "name": "NVIDIA H200", "total_bytes": 150754820096, "free_bytes": 42950852608, "used_bytes": 1,
         "processes": [{"pid": 4242, "name": "python3 -m vllm.entrypoints.cli.main serve /m", "used_bytes": 107803967488}]},
        {"index": 1, "name": "NVIDIA H200", "total_bytes": 150754820096, "free_bytes": 150109880320, "used_bytes": 1,
         "processes": []}]}
    levers = propose("free_memory_below_utilization", nums, {"explicit_args": []}, dev, [])
    assert levers[0]["id"] == "free_other_processes" and levers[0]["change"] == {"stop_pids": [4242]}
    assert "leftover engine" in levers[0]["arithmetic"][0]
    assert levers[0]["predicted"]["outcome"] == "fits"
    no_nvml = propose("free_memory_below_utilization", nums, {"explicit_args": []}, {"status": "unavailable"}, [])
    assert no_nvml[0]["id"] == "gpu_memory_utilization"
