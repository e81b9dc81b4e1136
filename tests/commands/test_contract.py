"""The names in docs/contract.md are fixed: scripts outside the project read them.

The literal lists below are the contract's tables; the same names are also read from docs/contract.md, so
neither side can drift."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from oomdoctor import contract

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_MD = ROOT / "docs" / "contract.md"

CLASSES = {
    "weights_load_oom": ("weights_load", "cuda_oom"),
    "free_memory_below_utilization": ("profiling", "startup_check"),
    "profiling_oom": ("profiling", "cuda_oom"),
    "kv_capacity": ("kv_reservation", "cache_capacity"),
    "kv_allocation_oom": ("kv_reservation", "cuda_oom"),
    "autotuner_oom": ("autotune", "cuda_oom"),
    "cuda_graph_oom": ("cuda_graph", "cuda_oom"),
    "sampler_warmup_oom": ("warmup", "cuda_oom"),
    "runtime_oom": ("runtime", "cuda_oom"),
    "kv_preemption": ("runtime", "kv_pressure"),
    "admission_rejection": ("admission", "rejection"),
    "config_invalid": ("config", "config_error"),
    "not_memory": ("none", "other"),
    "cascade_only": ("none", "unknown"),
    "unknown": ("none", "unknown"),
}
LEVERS = ["max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes", "kv_cache_dtype", "max_num_seqs",
          "max_num_batched_tokens", "enforce_eager", "cuda_graph_sizes", "quantization", "tensor_parallel_size",
          "pipeline_parallel_size", "cpu_offload_gb", "expandable_segments", "skip_mm_profiling",
          "free_other_processes", "admission_queue", "larger_gpu"]


def test_classes_phases_types_are_the_contracts() -> None:
    assert {k: (v["phase"], v["type"]) for k, v in contract.CLASSES.items()} == CLASSES


def test_lever_ids_are_the_contracts() -> None:
    assert list(contract.LEVERS) == LEVERS


def test_exit_codes() -> None:
    assert (contract.EXIT_OK, contract.EXIT_FAIL, contract.EXIT_BAD_INPUT, contract.EXIT_NO_MEMORY_FAILURE) == (0, 1, 2, 3)


def test_the_contract_file_says_the_same() -> None:
    text = CONTRACT_MD.read_text()
    rows = re.findall(r"^\| `([a-z_]+)` \| `([a-z_]+)` \| `([a-z_]+)` \|", text, re.M)
    assert {c: (p, t) for c, p, t in rows} == CLASSES
    lever_par = text.split("## Levers", 1)[1].split("A lever proposal", 1)[0]
    assert re.findall(r"`([a-z_]+)`", lever_par) == LEVERS


@pytest.mark.slow
def test_diagnose_json_has_the_contract_keys(tmp_path: Path) -> None:
    log = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200" / "A_fail.log"
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "diagnose", str(log), "--json", "--no-device",
                        "--out", str(tmp_path / "c.yaml")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d["classification"]) >= {"class", "phase", "type", "rule", "engine"}
    assert d["classification"]["rule"] == "vllm.kv_capacity.max_seq_len"
    assert all({"line", "text"} <= set(e) for e in d["evidence"])
    assert {"max_model_len", "kv_needed_bytes", "kv_available_bytes"} <= set(d["numbers"])
    assert all(isinstance(v, int) for k, v in d["numbers"].items() if k.endswith("_bytes"))
    lv = d["levers"][0]
    assert {"id", "change", "predicted", "cost"} <= set(lv) and lv["id"] in LEVERS
