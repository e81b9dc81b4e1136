"""A real served warm-up OOM (fixtures/logs/vllm-0.25.1-h200-morning/W1_serve_warmup.log, vllm serve 0.25.1 on the
H200): the V2 runner's warmup_kernels runs out on its max_num_seqs (1024) dummy requests. On the device
(incidents/h200-retest-2026-12-02-morning/) the card's first lever, max_num_seqs 256, passed in the second start."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.card.incident import diagnose_log

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200-morning" / "W1_serve_warmup.log"
MODEL = ROOT / "fixtures" / "models" / "gpukit-llama-886m"


def test_the_served_warmup_oom_is_read_from_its_frames(tmp_path):
    card, _, _ = diagnose_log(LOG, tmp_path / "c.yaml", no_device=True)
    c = card["classification"]
    assert (c["class"], c["phase"], c["engine"], c["engine_version"]) == ("sampler_warmup_oom", "warmup", "vllm",
                                                                          "0.25.1")
    assert c["phase_basis"] == "frames"


def test_its_workload_is_the_server_with_the_env_the_log_names(tmp_path):
    wl = diagnose_log(LOG, tmp_path / "c.yaml", no_device=True)[0]["workload"]
    assert wl["launcher"] == "vllm-serve"
    assert wl["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert wl["free_at_start_bytes"] == 5401346048          # the harness's NVML line: the ballast to rebuild


def test_the_first_lever_is_fewer_warmup_requests_as_a_serve_flag(tmp_path):
    lv = diagnose_log(LOG, tmp_path / "c.yaml", no_device=True, model_dir=MODEL)[0]["levers"][0]
    assert (lv["id"], lv["change"], lv["flag"]) == ("max_num_seqs", {"max_num_seqs": 256}, "--max-num-seqs 256")
    assert lv["predicted"]["model"]["fits"] is True


def test_the_served_capture_oom_is_read_from_its_frames_and_gets_the_eager_flag(tmp_path):
    # fixtures/logs/vllm-0.25.1-h200-morning/G1_serve_capture.log: F1b's pinned arena through vllm serve
    card, _, _ = diagnose_log(LOG.with_name("G1_serve_capture.log"), tmp_path / "c.yaml", no_device=True)
    c = card["classification"]
    assert (c["class"], c["phase"], c["phase_basis"], c["engine"]) == ("cuda_graph_oom", "cuda_graph", "frames", "vllm")
    assert card["workload"]["launcher"] == "vllm-serve" and "launcher_assumed" not in card["workload"]
    lv = card["levers"][0]
    assert (lv["id"], lv["change"], lv["flag"]) == ("enforce_eager", {"enforce_eager": True}, "--enforce-eager")


def test_the_eager_lever_of_a_pinned_arena_says_the_warm_up_can_run_out_next(tmp_path):
    # on the device (incidents/h200-retest-2026-12-02-morning/, second lease) enforce_eager moved G1's failure to
    # the warm-up: vLLM skips profiling for a pinned arena, and 0.78 GiB was left beside the weights
    lv = diagnose_log(LOG.with_name("G1_serve_capture.log"), tmp_path / "c.yaml", no_device=True)[0]["levers"][0]
    assert lv["id"] == "enforce_eager"
    w = lv["predicted"]["warning"]
    assert "does not profile a pinned KV arena" in w and "1,024 dummy requests" in w and "800.95 MiB" in w
    assert lv["predicted"]["outcome"] == "unknown"          # not "fits" beside that warning
    # a capture OOM without a pinned arena gets no such warning
    plain = diagnose_log(ROOT / "fixtures" / "logs" / "vllm-0.33.0-formatstrings" / "cuda_graph_oom.log",
                         tmp_path / "d.yaml", no_device=True)[0]["levers"]
    assert plain[0]["id"] == "enforce_eager" and "warning" not in plain[0]["predicted"]


def test_the_warmup_levers_why_says_what_the_pinned_arena_left(tmp_path):
    lv = diagnose_log(LOG, tmp_path / "c.yaml", no_device=True)[0]["levers"][0]
    assert lv["arithmetic"][0] == "the warm-up runs max_num_seqs (1,024) dummy requests"
    assert "did not profile the pinned KV arena" in lv["arithmetic"][1] and "544.45 MiB" in lv["arithmetic"][1]
