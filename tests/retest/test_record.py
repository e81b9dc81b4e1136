"""`oomdoctor record`: argv → workload, and `--serving-config` writing the receipt the gate asks for.

The engine run itself is replaced by a stand-in that writes a REAL passing vLLM 0.25.1 log (A_pass.log),
so the whole path — serving config → argv → run → diagnose → card → receipt → gate — is exercised on the CPU.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from oomdoctor.cli import main
from oomdoctor.card.workload import workload_from_argv
from oomdoctor.gate import load_serving_config
from oomdoctor.retest.run import RunResult
from tests.gate.runlog import run_log

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "gate-demo"
PASS_LOG = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200" / "A_pass.log"


def test_workload_from_vllm_serve_argv() -> None:
    wl = workload_from_argv(["vllm", "serve", "/m", "--max-model-len", "32768", "--enforce-eager",
                             "--gpu-memory-utilization=0.8", "--no-enable-prefix-caching", "--port", "9"], {"count": 2})
    assert wl["launcher"] == "vllm-serve" and wl["model"] == "/m"
    assert wl["engine_args"] == {"max_model_len": 32768, "enforce_eager": True, "gpu_memory_utilization": 0.8,
                                 "enable_prefix_caching": False}
    assert wl["requests"]["count"] == 2
    other = workload_from_argv(["python", "serve.py", "--x", "1"], {})
    assert other["launcher"] == "command" and other["argv"] == ["python", "serve.py", "--x", "1"]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_serving_config_record_writes_the_receipt_the_gate_needs(tmp_path: Path, monkeypatch, capsys) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(DEMO, repo)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "base")
    monkeypatch.chdir(repo)
    cfg = repo / "deploy" / "vllm.yaml"
    cfg.write_text(cfg.read_text().replace("max-model-len: 32768", "max-model-len: 65536"))

    def gate() -> int:
        with pytest.raises(SystemExit) as e:
            main(["gate", "--base", "main"])
        return e.value.code

    assert gate() == 1                                   # changed, no receipt yet
    capsys.readouterr()
    seen = {}

    def fake_run_engine(p, log_path, gpu_index, timeout_s, progress, phase_watch=None):
        seen["argv"] = p.argv
        log_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(seen["log"], log_path)
        return RunResult(0, False, 1.0, log_path, {"requests": 1, "served": 1, "output_tokens_per_s": 300.0}, True, None, [])

    gpu = {"status": "captured", "reason": "", "source": "nvml", "gpus": [
        {"index": 0, "name": "NVIDIA H200", "total_bytes": 150754820096, "free_bytes": 150109880320, "used_bytes": 0,
         "processes": []}]}
    monkeypatch.setattr("oomdoctor.retest.run.run_engine", fake_run_engine)
    monkeypatch.setattr("oomdoctor.device.nvml.capture", lambda with_processes=True: gpu)
    # the run's log must be of this config: a real passing log of another one (A_pass.log) writes no receipt
    seen["log"] = PASS_LOG
    with pytest.raises(SystemExit) as e:
        main(["record", "--serving-config", "deploy/vllm.yaml", "--target", "nvidia-h200", "--out", str(tmp_path / "a.yaml")])
    assert e.value.code == 2 and "the config in its log is not this one" in capsys.readouterr().err
    assert not list((repo / "receipts").glob("*.yaml")) if (repo / "receipts").exists() else True
    sc = load_serving_config("deploy/vllm.yaml")
    seen["log"] = run_log(tmp_path / "runs", sc.effective_config)
    with pytest.raises(SystemExit) as e:
        main(["record", "--serving-config", "deploy/vllm.yaml", "--target", "nvidia-h200", "--out", str(tmp_path / "c.yaml")])
    assert e.value.code == 3                             # a clean start: no memory failure
    assert "--max-model-len" in seen["argv"] and "65536" in seen["argv"]
    assert list((repo / "receipts").glob("*.yaml"))
    assert gate() == 0                                   # the receipt for the new fingerprint lets it pass


def test_serving_config_needs_a_declared_target(tmp_path: Path, monkeypatch, capsys) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(DEMO, repo)
    monkeypatch.chdir(repo)
    with pytest.raises(SystemExit) as e:
        main(["record", "--serving-config", "deploy/vllm.yaml", "--target", "rtx4090"])
    assert e.value.code == 2
    assert "not a declared target" in capsys.readouterr().err
