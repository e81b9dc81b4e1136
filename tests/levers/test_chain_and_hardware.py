"""Each lever's prediction from the start to the end (the chain), and levers that need other hardware.

The chain runs the memory model (engines/vllm/memory.py through levers/plan.py) on the card's settings with the
lever's change; when the start would still fail it names the next failure and the lever for it."""
from __future__ import annotations

import copy
from pathlib import Path

from oomdoctor.card.incident import diagnose_log
from oomdoctor.levers import engine as levermod
from oomdoctor.levers.chain import check_chain, expected_chain, first_follow_up
from oomdoctor.levers.plan import plan

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
MODEL = ROOT / "fixtures" / "models" / "gpukit-llama-886m"      # the H200 logs' model (its config.json)
ONE_H200 = {"status": "captured", "reason": "", "source": "nvml", "gpus": [
    {"index": 0, "name": "NVIDIA H200", "total_bytes": 150754820096, "free_bytes": 150109880320, "used_bytes": 0,
     "processes": []}]}


def flagless_b(tmp_path: Path) -> Path:
    """B_fail as the flagless start it would have been: no --max-model-len, so vLLM resolves the checkpoint's
    4,000,000 (the two lines A_fail shows for it), under the same 40 GiB ballast."""
    text = (H200 / "B_fail.log").read_text()
    text = (text.replace("{'max_model_len': 32768, 'disable_log_stats'", "{'disable_log_stats'")
            .replace("Using max model len 32768", "Using max model len 4000000").replace("max_seq_len=32768", "max_seq_len=4000000"))
    p = tmp_path / "B_flagless.log"
    p.write_text(text)
    return p


def util_lever(card: dict) -> dict:
    return next(lv for lv in card["levers"] if lv["id"] == "gpu_memory_utilization")


def test_b_fail_chain_ends_in_a_fitting_start(tmp_path: Path) -> None:
    card, _, _ = diagnose_log(H200 / "B_fail.log", tmp_path / "b.yaml", no_device=True, model_dir=MODEL)
    lv = util_lever(card)
    assert lv["change"] == {"gpu_memory_utilization": 0.27}
    chain = expected_chain(card, lv)
    assert chain["text"].startswith("gpu_memory_utilization 0.27 passes the start-up check; then the start fits")
    assert first_follow_up(chain) == "fits"
    assert lv["predicted"]["chain"] == chain["text"]                   # written into the card by diagnose --model


def test_flagless_b_chain_predicts_the_window_failure_and_its_lever(tmp_path: Path) -> None:
    card, _, _ = diagnose_log(flagless_b(tmp_path), tmp_path / "b.yaml", no_device=True, model_dir=MODEL)
    chain = expected_chain(card, util_lever(card))
    steps = chain["steps"]
    assert steps[1]["failure"] == "kv_capacity" and "4000000 tokens needs 244.14 GiB KV" in steps[1]["reason"]
    # the follow-up lever is the memory model's own for that start: utilization 0.27 with the 4,000,000 window
    at_027 = plan(str(MODEL), 150754820096, free=card["workload"]["free_at_start_bytes"], gpu_memory_utilization=0.27,
                  max_model_len=4000000, engine_version="0.25.1", usage_context="llm")
    assert not at_027["fits"] and at_027["failure"]["class"] == "kv_capacity"
    window = at_027["levers"][0]["change"]["max_model_len"]
    assert steps[2] == {"lever": "max_model_len", "change": {"max_model_len": window},
                        "text": f"→ max_model_len ≤ {window:,}"}
    assert window * 65536 <= at_027["available_kv_bytes"]              # 64 KiB of KV per token (manifest.yaml)
    assert steps[3]["predicted"] == "fits"
    assert chain["text"].startswith("gpu_memory_utilization 0.27 passes the start-up check; then kv_capacity: one "
                                    "request of 4000000 tokens needs 244.14 GiB KV")
    assert first_follow_up(chain) == "kv_capacity"
    assert check_chain(chain, "fail", "kv_capacity") == {"expected": "kv_capacity", "observed": "kv_capacity",
                                                          "status": "confirmed"}
    assert check_chain(chain, "pass", "unknown")["status"] == "not_confirmed"
    assert check_chain(chain, "inconclusive", "not_memory") is None


def test_chain_without_a_model_config_is_the_lever_alone(tmp_path: Path) -> None:
    card, _, _ = diagnose_log(H200 / "B_fail.log", tmp_path / "b.yaml", no_device=True)
    chain = expected_chain(card, util_lever(card))
    assert chain["model"] is None and first_follow_up(chain) is None
    assert "no model config" in chain["text"]


def test_levers_needing_more_gpus_are_marked_and_listed_last(tmp_path: Path) -> None:
    card, _, diag = diagnose_log(H200 / "A_fail.log", tmp_path / "a.yaml", no_device=True)
    unmarked = [lv["id"] for lv in card["levers"]]
    assert unmarked.index("tensor_parallel_size") < unmarked.index("gpu_memory_utilization")
    levers = levermod.propose(diag.klass, diag.numbers, copy.deepcopy(card["workload"]), ONE_H200, [],
                              allowed=diag.levers or None)
    ids = [lv["id"] for lv in levers]
    assert ids[-2:] == ["tensor_parallel_size", "larger_gpu"]
    tp = levers[-2]
    assert tp["needs_hardware"] == "2 GPUs (TP 2 x PP 1 x DP 1); the recorded device has 1 (NVIDIA H200)"
    assert tp["applies_as"] == "hardware" and tp["arithmetic"][-1] == "needs other hardware: " + tp["needs_hardware"]
    assert levers[-1]["needs_hardware"].startswith("another GPU with at least")
    assert not any(lv.get("needs_hardware") for lv in levers[:-2])
    eight = {**ONE_H200, "gpus": ONE_H200["gpus"] * 8}
    on_eight = levermod.propose(diag.klass, diag.numbers, copy.deepcopy(card["workload"]), eight, [],
                                allowed=diag.levers or None)
    assert not next(lv for lv in on_eight if lv["id"] == "tensor_parallel_size").get("needs_hardware")


def test_the_chain_predicts_what_the_real_h200_runs_recorded(tmp_path: Path) -> None:
    """incidents/h200-C2_fail.yaml holds the real retests on the H200: stopping the co-tenant exposed a kv_capacity
    failure (the explicit utilization 0.005), and utilization 0.97 then passed. The chain, from the log and the model's
    config alone, expects exactly that; B's utilization 0.27 was expected to fit and did."""
    from oomdoctor.card import store

    card, _, _ = diagnose_log(H200 / "C2_fail.log", tmp_path / "c2.yaml", no_device=True, model_dir=MODEL)
    lv = card["levers"][0]
    assert lv["id"] == "free_other_processes"
    chain = expected_chain(card, lv)
    real = store.load_dict(ROOT / "incidents" / "h200-C2_fail.yaml")["attempts"]
    assert [a["lever"] for a in real] == ["none", "free_other_processes", "gpu_memory_utilization"]
    assert check_chain(chain, real[1]["outcome"], real[1]["classification"]["class"])["status"] == "confirmed"
    assert chain["steps"][2]["change"] == real[2]["change"] == real[1]["next_lever"]["change"]
    assert chain["steps"][3]["predicted"] == "fits" and real[2]["outcome"] == "pass"

    card, _, _ = diagnose_log(H200 / "B_fail.log", tmp_path / "b.yaml", no_device=True, model_dir=MODEL)
    real = store.load_dict(ROOT / "incidents" / "h200-B_fail.yaml")["attempts"]
    assert real[-1]["change"] == util_lever(card)["change"]
    assert check_chain(expected_chain(card, util_lever(card)), real[-1]["outcome"],
                       real[-1]["classification"]["class"])["status"] == "confirmed"


def test_a_kv_allocation_oom_without_figures_gets_a_software_lever_first(tmp_path: Path) -> None:
    # a paste's tail (and the TPU's wording) gives no free/total figure to size the KV cache by: the step down of
    # gpu_memory_utilization comes first, hardware last, never hardware alone
    for log in (ROOT / "fixtures" / "logs" / "field-guide" / "vllm-v1-018.log",
                ROOT / "fixtures" / "logs" / "vllm-accel-formatstrings" / "tpu_kv_alloc_oom.log"):
        card, _, diag = diagnose_log(log, tmp_path / f"{log.stem}.yaml", no_device=True)
        assert diag.klass == "kv_allocation_oom"
        ids = [lv["id"] for lv in card["levers"]]
        assert ids[0] == "gpu_memory_utilization" and ids[-1] == "larger_gpu", ids
        assert util_lever(card)["change"]["gpu_memory_utilization"] < 0.95


def test_the_chain_reads_the_starts_config_overrides_as_the_real_profiling_run_showed(tmp_path: Path) -> None:
    """vllm-0.25.1-h200-evening/P1_profile.log: a start with hf_overrides max_position_embeddings=32768 (its RoPE
    cache so small that "Model loading took 1.66 GiB", not the checkpoint's 4,000,000 rows' 2.60 GiB) under a
    ballast leaving 2.8 GiB runs out of memory while torch.compile autotunes the first forward's kernels (in the
    profiling pass). The real retests on the H200 (incidents/h200-retest-2026-12-01-evening/h200-P1_profile.yaml)
    halved max_num_batched_tokens twice and it still failed there. Read with the overrides, the chain of that lever
    expects exactly that (before, it expected a weights_load_oom: weights 2.60 GiB > free); the model's profiling
    step is the log's autotuner_oom's step, so the recorded config's prediction agrees with the log. The levers now
    rank the process that holds the GPU first, then eager mode (no compilation), then the smaller chunks."""
    from oomdoctor.card import store

    log = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200-evening" / "P1_profile.log"
    card, _, _ = diagnose_log(log, tmp_path / "p1.yaml", no_device=True, model_dir=MODEL)
    assert card["classification"]["class"] == "autotuner_oom"
    assert card["model_check"]["recorded_config"]["failure"] == "profiling_oom"
    assert card["model_check"]["agrees_with_log"] is True
    ids = [lv["id"] for lv in card["levers"]]
    assert ids[:3] == ["free_other_processes", "enforce_eager", "max_num_batched_tokens"], ids
    first = expected_chain(card, card["levers"][0])
    assert [s["failure"] for s in first["steps"][1:2]] == ["kv_capacity"], first["text"]   # gpu_memory_utilization 0.005
    lv = card["levers"][2]
    chain = expected_chain(card, lv)
    assert chain["steps"][1]["failure"] == "profiling_oom", chain["text"]
    real = store.load_dict(ROOT / "incidents" / "h200-retest-2026-12-01-evening" / "h200-P1_profile.yaml")["attempts"]
    assert [a["lever"] for a in real] == ["none", "max_num_batched_tokens", "max_num_batched_tokens"]
    assert real[1]["change"] == lv["change"]
    assert check_chain(chain, real[1]["outcome"], real[1]["classification"]["class"])["status"] == "confirmed"
    # the same attempt read with today's rules (autotuner_oom) confirms it too: the same start-up step
    assert check_chain(chain, real[1]["outcome"], "autotuner_oom")["status"] == "confirmed"
    assert check_chain(chain, real[1]["outcome"], "kv_capacity")["status"] == "not_confirmed"
