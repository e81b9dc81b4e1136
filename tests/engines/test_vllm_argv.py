"""ONE vLLM argv reader (engines/vllm/argv.py): record's workload, the gate and the plugin read a command line alike."""
from __future__ import annotations

from oomdoctor.card.workload import workload_from_argv
from oomdoctor.engines.vllm.argv import flagged_fields, normalize_args, parse_serve_args

ARGV = ["vllm", "serve", "M", "-tp", "2", "--max-model-len", "8192", "--cuda-graph-sizes", "1", "2", "4",
        "--enforce-eager"]


def test_record_keeps_the_tensor_parallel_size_of_a_short_flag() -> None:
    """`oomdoctor record -- vllm serve M -tp 2` lost the tensor-parallel size that the gate's parser keeps."""
    wl = workload_from_argv(ARGV, {})
    assert wl["model"] == "M"
    assert wl["engine_args"] == {"tensor_parallel_size": 2, "max_model_len": 8192, "cuda_graph_sizes": [1, 2, 4],
                                 "enforce_eager": True}


def test_gate_record_and_plugin_read_the_same_settings() -> None:
    model, _, pairs, _ = parse_serve_args(ARGV[2:], "cmd")
    gate = normalize_args(pairs, "cmd", strict=False)
    assert model == "M" and set(gate) == set(workload_from_argv(ARGV, {})["engine_args"])
    names = ["tensor_parallel_size", "max_model_len", "cuda_graph_sizes", "enforce_eager", "model", "compilation_config"]
    assert flagged_fields(ARGV[2:], names) == ["tensor_parallel_size", "max_model_len", "cuda_graph_sizes",
                                               "enforce_eager"]
    assert flagged_fields(["-O", "3"], names) == ["compilation_config"]
