"""The workload carries every setting the log reveals: env variables the engine names in its own lines, the launcher,
the model path, the port, the TP/PP sizes; `record` keeps the engine-relevant part of the real environment, redacted."""
from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.card.workload import from_log, recorded_env, workload_from_argv
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules
from oomdoctor.redact import MASK

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "fixtures" / "logs"
H200 = LOGS / "vllm-0.25.1-h200"


def workload(path: Path) -> dict:
    d = diagnose_file(path, default_rules())
    return dict(from_log(path, d.matches, d.engine))


def without_harness_env(src: Path, dst: Path) -> Path:
    """The real log without the capture harness's '# env:' line: only the engine's own lines are left to say it."""
    dst.write_text("".join(ln for ln in src.read_text().splitlines(keepends=True) if not ln.startswith("# env:")))
    return dst


@pytest.mark.parametrize("name", ["A_fail", "D_fail", "F1b_fail", "F2_fail"])
def test_env_the_engine_names_is_in_the_workload(tmp_path: Path, name: str) -> None:
    log = without_harness_env(H200 / f"{name}.log", tmp_path / f"{name}.log")
    wl = workload(log)
    assert wl["env"] == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    (rev,) = wl["env_revealed"]
    assert rev["rule"] == "vllm.workload.env_flashinfer_sampler"
    assert "disabled via VLLM_USE_FLASHINFER_SAMPLER=0" in log.read_text().splitlines()[rev["line"] - 1]


@pytest.mark.parametrize("name", ["A_fail", "B_fail", "C2_fail", "D_fail", "F1b_fail"])
def test_every_fail_log_card_carries_the_env_of_its_run(name: str) -> None:
    wl = workload(H200 / f"{name}.log")
    assert wl["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"          # harness header or the engine's own line
    assert wl["env"]["PYTHONPATH"] == "/root/site"
    assert wl["model"] == "/root/model" and wl["launcher"] == "vllm-llm"
    assert wl["parallel"] == {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1, "gpus": 1}


def test_a_log_that_names_no_env_gives_none(tmp_path: Path) -> None:
    # B_fail stopped at the start-up check, before the sampler line: without the header nothing names the env
    wl = workload(without_harness_env(H200 / "B_fail.log", tmp_path / "B.log"))
    assert wl["env"] == {} and "env_revealed" not in wl


def test_serve_launcher_and_port() -> None:
    wl = workload(H200 / "F2_fail.log")
    assert wl["launcher"] == "vllm-serve" and wl["port"] == 8011 and wl["model"] == "/root/model"
    assert "port" not in wl["engine_args"]


def test_v1_runner_where_the_version_picks_v2_means_the_env_said_so() -> None:
    wl = workload(LOGS / "vllm-0.33.0-formatstrings" / "sampler_warmup_oom.log")
    assert wl["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    (rev,) = [r for r in wl["env_revealed"] if r["name"] == "VLLM_USE_V2_MODEL_RUNNER"]
    assert rev["line"] == 8 and "inferred" in rev
    # the V2 runner announced itself: no such variable
    assert "VLLM_USE_V2_MODEL_RUNNER" not in workload(H200 / "A_fail.log")["env"]


def test_advice_is_not_a_setting() -> None:
    """'To try it now, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1' is advice; 'is disabled (…=0)' is the state."""
    assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS" not in workload(LOGS / "field-guide" / "vllm-v1-023.log").get("env", {})
    wl = workload(LOGS / "vllm-0.33.0-formatstrings" / "cuda_graph_oom.log")
    assert wl["env"]["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "0"


def test_record_keeps_the_engine_env_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "PYTHONPATH": "/root/site", "HF_TOKEN": "hf_" + "a" * 30,
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUDA_VISIBLE_DEVICES": "3", "HOME": "/root",
           "TRITON_CACHE_DIR": "/tmp/t", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}
    got = recorded_env(env)
    assert got["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and got["PYTHONPATH"] == "/root/site"
    assert got["HF_TOKEN"] == MASK and "hf_aaaa" not in str(got)
    assert got["TRITON_CACHE_DIR"] == "/tmp/t" and got["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"
    assert "CUDA_VISIBLE_DEVICES" not in got and "HOME" not in got        # --gpu picks the GPU; HOME is not the engine's
    for k in list(__import__("os").environ):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    wl = workload_from_argv(["vllm", "serve", "/m", "--max-model-len", "4096"], {})
    assert wl["env"] == got


def test_v1_runner_the_engine_chose_itself_needs_no_env(tmp_path: Path) -> None:
    """With 0.33.0's own fallback warning (its format string, vllm-messages.md) the V1 runner is the engine's choice."""
    lines = (LOGS / "vllm-0.33.0-formatstrings" / "sampler_warmup_oom.log").read_text().splitlines(keepends=True)
    warn = ("(EngineCore pid=6631) WARNING 12-02 09:14:18 [vllm.py:731] Model Runner V2 does not yet support "
            "speculative decoding; using the V1 model runner instead.\n")
    p = tmp_path / "fallback.log"
    p.write_text("".join(lines[:7] + [warn] + lines[7:]))
    assert "VLLM_USE_V2_MODEL_RUNNER" not in workload(p)["env"]
