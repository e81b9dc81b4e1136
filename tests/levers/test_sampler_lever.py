"""The warm-up's lever starts from the max_num_seqs the engine ran with. vLLM's message states it ("warming up
sampler with 256 dummy requests": the warm-up runs max_num_seqs dummy requests); the lever had assumed vLLM's
default 1024 and proposed 256 for a run that already had 256, and 256 for an HPU pooler warm-up of 128."""
from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.card.incident import diagnose_log

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


@pytest.mark.parametrize("log, ran, new", [
    ("field-guide/vllm-v1-024.log", 256, 64),                          # the message's 256 dummy requests
    ("vllm-accel-formatstrings/hpu_pooler_warmup_oom.log", 128, 32),   # vllm-gaudi's pooler warm-up of 128
    ("vllm-0.25.1-h200-morning/W1_serve_warmup.log", 1024, 256),       # no count in the log: vLLM's default
])
def test_the_warmup_lever_lowers_the_count_the_engine_ran_with(tmp_path, log, ran, new):
    card, _, _ = diagnose_log(LOGS / log, tmp_path / "c.yaml", no_device=True)
    assert card["classification"]["class"] == "sampler_warmup_oom"
    lv = card["levers"][0]
    assert lv["id"] == "max_num_seqs" and lv["change"] == {"max_num_seqs": new}
    assert lv["cost"] == f"at most {new} concurrent sequences instead of {ran}"


@pytest.mark.parametrize("log, first, pid", [
    ("vllm-0.25.1-h200-morning/W1_serve_warmup.log", "max_num_seqs", 3134),
    ("vllm-0.25.1-h200-morning/G1_serve_capture.log", "enforce_eager", 907),
    ("vllm-0.25.1-h200-dawn/S1_serve_runtime.log", "max_num_batched_tokens", 1465),
    ("vllm-0.25.1-h200-evening/G1_sampler.log", "max_num_seqs", 873),      # its max_num_seqs explicit: still first
])
def test_the_process_the_oom_names_is_offered_after_the_classs_own_levers(tmp_path, log, first, pid):
    # capture, warm-up and serving steps run out beside a co-tenant as the start's allocations do; freeing it had
    # been offered for those only
    levers = diagnose_log(LOGS / log, tmp_path / "c.yaml", no_device=True)[0]["levers"]
    ids = [lv["id"] for lv in levers]
    assert ids[0] == first and "free_other_processes" in ids
    free = levers[ids.index("free_other_processes")]
    assert free["change"] == {"stop_pids": [pid]} and ids.index("free_other_processes") > 0


def test_a_paste_of_a_high_ranks_lines_gets_no_tensor_parallel_size_of_2(tmp_path):
    # field-guide vllm-v1-002: '(VllmWorker rank=5 pid=41873)': 6 GPUs or more, of a size the paste does not give;
    # "tensor_parallel_size 2: 2 GPUs instead of 1" had been lever #2
    card, _, _ = diagnose_log(LOGS / "field-guide" / "vllm-v1-002.log", tmp_path / "c.yaml", no_device=True)
    assert card["workload"]["parallel"] == {"ranks_seen": 6}
    assert "tensor_parallel_size" not in [lv["id"] for lv in card["levers"]]
    # a single-process log keeps its tensor-parallel lever
    one, _, _ = diagnose_log(LOGS / "vllm-0.25.1-h200" / "C2_fail.log", tmp_path / "d.yaml", no_device=True)
    assert "parallel" not in one["workload"] or "ranks_seen" not in one["workload"]["parallel"]
