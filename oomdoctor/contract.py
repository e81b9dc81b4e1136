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


# Every command's exit codes: the table of docs/contract.md ("Exit codes, every command"), printed by
# `oomdoctor --help`. Codes every command shares (2 bad input, 70, 130, a closed stdout) are in COMMON_EXIT_CODES.
EXIT_INTERNAL = 70           # a bug: one line on stderr (OOMDOCTOR_DEBUG=1 shows the traceback)
EXIT_INTERRUPTED = 130       # Ctrl-C / SIGINT (a ladder resumes when run again)

EXIT_CODES: dict[str, dict[int, str]] = {
    "diagnose": {0: "a memory failure was classified", 3: "no memory failure found (not_memory, cascade_only, "
                 "unknown, or a clean log)", 2: "bad input or usage"},
    "retest": {0: "the failure is gone and the performance recheck passed", 1: "it still fails or performance "
               "regressed", 2: "bad input or usage", 3: "inconclusive: the run failed for a reason that is not the "
               "lever's (environment, a crash before the original phase, a timeout); the lever stays untried",
               4: "a twin prediction: no engine ran (outcomes predicted_pass, predicted_fail, predicted_unknown)"},
    "record": {0: "the launch failed with a memory failure, classified (as diagnose)", 3: "the launch showed no "
               "memory failure (it started; with --serving-config the receipt is written)", 2: "bad input or usage"},
    "gate": {0: "every changed serving config has a passing real retest (or nothing changed)", 1: "at least one "
             "changed config has none", 2: "bad input or usage (project file, config, base ref, not a git repository)"},
    "plan": {0: "the start is predicted to fit", 1: "it is predicted not to fit (any failure class)",
             2: "bad input or usage"},
    "ladder": {0: "the threshold was measured (and a declared requirement is not under it)", 1: "not measured "
               "(no start at the high end, a start at the low end, stopped early) or under-declared",
               2: "bad input or usage"},
    "compare": {0: "the two logs were compared", 2: "bad input or usage"},
    "admit": {0: "admit", 1: "queue or reject (the output's decision says which)", 2: "bad input or usage"},
    "snapshot": {0: "the snapshot was read and reported", 2: "bad input (not a pickle, a pickle that imports "
                 "anything, not a memory snapshot)"},
    "rules": {0: "listed, or every rule's test cases pass", 1: "rules test: at least one case fails",
              2: "bad input or usage (a malformed rule file)"},
}
COMMON_EXIT_CODES: dict[int, str] = {
    2: "bad input or usage: one line on stderr starting `oomdoctor: error:`, never a traceback",
    EXIT_INTERNAL: "internal error (a bug): one line on stderr; OOMDOCTOR_DEBUG=1 shows the traceback",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
