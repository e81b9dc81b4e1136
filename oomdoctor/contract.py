"""The names fixed by docs/contract.md (the project's copy of the contract). Scripts outside the project read them: never rename.

tests/test_contract.py pins every name here against the contract's tables.
"""
from __future__ import annotations

CLASSES: dict[str, dict[str, str]] = {
    "weights_load_oom": {"phase": "weights_load", "type": "cuda_oom"},
    "free_memory_below_utilization": {"phase": "profiling", "type": "startup_check"},
    "profiling_oom": {"phase": "profiling", "type": "cuda_oom"},
    "kv_capacity": {"phase": "kv_reservation", "type": "cache_capacity"},
    "kv_allocation_oom": {"phase": "kv_reservation", "type": "cuda_oom"},
    "autotuner_oom": {"phase": "autotune", "type": "cuda_oom"},
    "cuda_graph_oom": {"phase": "cuda_graph", "type": "cuda_oom"},
    "sampler_warmup_oom": {"phase": "warmup", "type": "cuda_oom"},
    "runtime_oom": {"phase": "runtime", "type": "cuda_oom"},
    "kv_preemption": {"phase": "runtime", "type": "kv_pressure"},
    "admission_rejection": {"phase": "admission", "type": "rejection"},
    "config_invalid": {"phase": "config", "type": "config_error"},
    "not_memory": {"phase": "none", "type": "other"},
    "cascade_only": {"phase": "none", "type": "unknown"},
    "unknown": {"phase": "none", "type": "unknown"},
}

# Start-up order of the phases a log can reach (config first, runtime last); plus the two
# that are not start-up steps.
PHASES: tuple[str, ...] = (
    "config", "weights_load", "profiling", "kv_reservation", "autotune", "cuda_graph", "warmup",
    "runtime", "admission", "none",
)

LEVERS: tuple[str, ...] = (
    "max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes", "kv_cache_dtype",
    "max_num_seqs", "max_num_batched_tokens", "enforce_eager", "cuda_graph_sizes",
    "quantization", "tensor_parallel_size", "pipeline_parallel_size", "cpu_offload_gb",
    "expandable_segments", "skip_mm_profiling", "free_other_processes", "admission_queue",
    "larger_gpu",
)

NO_MEMORY_FAILURE = ("not_memory", "cascade_only", "unknown")

# exit codes
EXIT_OK = 0
EXIT_FAIL = 1          # retest: still fails / regressed; gate: a change lacks a receipt; plan: does not fit
EXIT_BAD_INPUT = 2
EXIT_NO_MEMORY_FAILURE = 3   # diagnose only
EXIT_INCONCLUSIVE = 3        # retest only: the run failed for a reason that is not the lever's (outcome inconclusive)
EXIT_PREDICTION = 4          # retest only: a twin prediction, no engine ran (never a pass)


def classification(klass: str) -> dict[str, str]:
    c = CLASSES[klass]
    return {"class": klass, "phase": c["phase"], "type": c["type"]}
