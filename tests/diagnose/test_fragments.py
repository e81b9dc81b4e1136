"""Reading pastes (issue 12): the issue's own examples, the phase basis and confidence, wrapper-only pastes,
frames as data, serving evidence. Every log is a fixture rendered from vLLM's own format strings."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from oomdoctor.diagnose.classify import diagnose_file, diagnose_lines
from oomdoctor.diagnose.read import SourceInfo
from oomdoctor.diagnose.rules import build_rule, default_rules, frame_patterns
from oomdoctor.errors import RuleError

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
FG = LOGS / "field-guide"
RULES = default_rules()


def _diag(path: Path):
    return diagnose_file(path, RULES)


def _lines(path: Path, keep) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8").splitlines()
    return [(i + 1, t) for i, t in enumerate(text) if keep(t)]


def test_example1_sampler_message_names_its_phase_without_milestones_or_frames():
    # only the exception line of the paste: before, the rule matched and the tool said "phase unknown"
    lines = _lines(FG / "vllm-v1-024.log", lambda t: "warming up sampler" in t)
    assert len(lines) == 1
    d = diagnose_lines(lines, RULES, SourceInfo(str(FG / "vllm-v1-024.log")))
    assert (d.klass, d.phase) == ("sampler_warmup_oom", "warmup")
    assert (d.phase_basis_kind, d.confidence) == ("message", "high")
    assert d.numbers["sampler_warmup_requests"] == 256


def test_example2_cuda_error_at_capture_end_under_vllmworker_rank_prefix():
    d = _diag(FG / "vllm-v1-020.log")
    assert (d.klass, d.phase, d.engine) == ("cuda_graph_oom", "cuda_graph", "vllm")
    assert d.phase_basis_kind == "frames" and "vllm.frame.capture" in d.phase_basis
    assert d.root.line.proc.startswith("VllmWorker rank=")


def test_example3_oom_after_added_request_and_a_500_is_a_runtime_oom():
    d = _diag(LOGS / "vllm-0.6-formatstrings" / "serving_runtime_oom.log")
    assert (d.klass, d.phase, d.engine) == ("runtime_oom", "runtime", "vllm")
    assert (d.phase_basis_kind, d.confidence) == ("serving", "high")
    assert d.numbers["tried_to_allocate_bytes"] == int(1.27 * 2**30)


def test_example4_context_length_is_a_rejection_not_not_memory():
    d = _diag(FG / "vllm-v1-031.log")
    assert (d.klass, d.phase) == ("admission_rejection", "admission")
    assert d.numbers["max_model_len"] == 1700


def test_serving_evidence_does_not_move_a_start_up_error():
    # the same OOM line without the serving lines has no phase evidence: the most likely phase, said so
    path = LOGS / "vllm-0.6-formatstrings" / "serving_runtime_oom.log"
    d = diagnose_lines(_lines(path, lambda t: "OutOfMemoryError(" in t), RULES, SourceInfo(str(path)), engine="vllm")
    assert (d.phase_basis_kind, d.confidence) == ("likely", "low")
    assert d.klass == "weights_load_oom" and "profile_run" in d.settle


def test_bare_oom_line_is_never_unknown_and_names_the_lines_that_settle_it():
    d = _diag(FG / "vllm-v0p-006.log")
    assert d.is_memory_failure and d.klass != "unknown"
    c = d.classification()
    assert (c["phase_basis"], c["confidence"]) == ("likely", "low")
    assert "load_model" in c["settled_by"] and "Model loading took" in c["settled_by"]


def test_wrapper_only_paste_is_cascade_only_and_says_whose_output_to_fetch():
    d = _diag(FG / "vllm-v1-006.log")
    assert d.klass == "cascade_only" and not d.is_memory_failure
    c = d.classification()
    assert "engine core" in c["root_cause_in"] and "docker logs" in c["root_cause_in"]
    clean = _diag(FG / "vllm-v1-047.log")
    assert clean.klass == "unknown" and "root_cause_in" not in clean.classification()


@pytest.mark.slow
def test_cascade_only_json_and_exit_code(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "diagnose", str(FG / "vllm-v1-006.log"), "--json",
                        "--out", str(tmp_path / "c.yaml")], capture_output=True, text=True)
    assert r.returncode == 3
    c = json.loads(r.stdout)["classification"]
    assert c["class"] == "cascade_only" and "root_cause_in" in c


def test_message_before_its_traceback_takes_the_frames_after_it():
    # NPU OOM printed before "WorkerProc hit an exception." and the traceback through execute_model
    d = _diag(FG / "vllm-v1-025.log")
    assert (d.klass, d.phase, d.phase_basis_kind) == ("runtime_oom", "runtime", "frames")


def test_cut_traceback_gets_its_phase_from_frames_with_low_confidence():
    d = _diag(FG / "vllm-v1-002.log")
    assert (d.klass, d.phase) == ("weights_load_oom", "weights_load")
    assert d.confidence == "low" and d.rule == "vllm.traceback.cut"


def test_worker_header_with_its_traceback_cut_is_placed_by_the_milestones_before_it():
    # "WorkerProc hit an exception." right after the capture progress, its traceback cut (a condensed paste)
    d = _diag(FG / "vllm-v1-021.log")
    assert (d.klass, d.phase, d.rule) == ("cuda_graph_oom", "cuda_graph", "vllm.traceback.worker_header_cut")
    assert (d.phase_basis_kind, d.confidence) == ("milestones", "low")
    # the header alone, with nothing that places it, is no memory failure
    path = FG / "vllm-v1-021.log"
    alone = diagnose_lines(_lines(path, lambda t: "WorkerProc hit an exception" in t), RULES, SourceInfo(str(path)))
    assert alone.klass == "unknown" and not alone.is_memory_failure
    # with its traceback, the exception line decides (here an illegal memory access)
    assert _diag(FG / "vllm-v1-041.log").klass == "not_memory"


def test_tgi_shard_traceback_cut_is_placed_by_its_frames_with_low_confidence():
    d = _diag(FG / "oe-038.log")
    assert (d.klass, d.phase, d.engine, d.rule) == ("weights_load_oom", "weights_load", "tgi", "tgi.traceback.cut")
    assert d.confidence == "low"


def test_engine_from_its_own_message_when_no_detection_string():
    d = _diag(FG / "vllm-v1-008.log")
    assert d.engine == "vllm" and d.klass == "free_memory_below_utilization"


def test_frames_field_builds_cpython_faulthandler_and_ipython_forms():
    pats = [p["regex"] for p in frame_patterns(["profile_run", "torch/cuda/graphs.py:capture_end"], "t")]
    import re
    lines = ['  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1651, in profile_run',
             '  File "/x/vllm/worker/model_runner.py", line 12 in profile_run',
             'File /opt/venv/lib/python3.12/site-packages/vllm/worker/model_runner.py:1298, in GPUModelRunner.profile_run(self)',
             '  File "/usr/lib/python3/site-packages/torch/cuda/graphs.py", line 84, in capture_end']
    for t in lines:
        assert any(re.search(p, t) for p in pats), t
    assert not any(re.search(p, '  File "/x/y.py", line 3, in profile_run_helper') for p in pats)


@pytest.mark.parametrize("bad,msg", [
    ({"role": "root", "class": "runtime_oom", "frames": ["x"], "patterns": ["Runtime failure"]}, "role: frame"),
    ({"role": "root", "class_by_phase": {"runtime": "runtime_oom"}, "likely_phase": "profiling",
      "patterns": ["Runtime failure"]}, "likely_phase"),
    ({"role": "root", "class": "runtime_oom", "confidence": "sure", "patterns": ["Runtime failure"]}, "confidence"),
    ({"role": "frame", "reaches": "runtime", "frames": ["a b"]}, "function name"),
])
def test_new_rule_fields_are_checked(bad, msg):
    with pytest.raises(RuleError, match=msg):
        build_rule({"id": "vllm.t.x", "engine": "vllm", **bad}, Path("t.yaml"), "vllm")


def test_a_few_stray_bytes_do_not_make_a_log_binary(tmp_path):
    # a real H200 log with a NUL and a broken UTF-8 sequence in the middle keeps its diagnosis
    raw = (LOGS / "vllm-0.25.1-h200" / "A_fail.log").read_bytes().split(b"\n")
    raw[len(raw) // 3] += b" \x00 \xff\xfe\xc3"
    p = tmp_path / "A_fail_stray.log"
    p.write_bytes(b"\n".join(raw))
    assert _diag(p).klass == _diag(LOGS / "vllm-0.25.1-h200" / "A_fail.log").klass == "kv_capacity"


def test_wrapper_prefixes_are_stripped_before_the_engine_prefix():
    from oomdoctor.diagnose.parse import parse_line
    compose = (FG / "vllm-v1-011.log").read_text(encoding="utf-8").splitlines()[0]
    assert compose.startswith("qwen3-1  | ") and parse_line(1, compose).msg == "vLLM API server version 0.8.5"
    relog = (FG / "vllm-v1-017.log").read_text(encoding="utf-8").splitlines()[0]
    line = parse_line(1, relog)
    assert (line.proc, line.pid) == ("EngineCore", "45102") and line.msg.startswith("torch.OutOfMemoryError: HIP")
    ray = next(t for t in (FG / "vllm-v0p-007.log").read_text(encoding="utf-8").splitlines() if ", ip=" in t)
    assert parse_line(1, ray).proc == "NPURayWorkerWrapper"


def test_chained_exception_outer_traceback_places_the_oom():
    # V0: the worker's first traceback shows only execute_model; the chained one shows profile_run
    d = _diag(FG / "vllm-v0p-010.log")
    assert (d.klass, d.phase, d.phase_basis_kind) == ("profiling_oom", "profiling", "frames")


def test_jupyter_render_is_read_by_its_frames():
    d = _diag(LOGS / "vllm-0.6-formatstrings" / "jupyter_profiling_oom.log")
    assert (d.klass, d.phase, d.engine) == ("profiling_oom", "profiling", "vllm")
    assert d.phase_basis_kind == "frames" and "vllm.frame.profile_run" in d.phase_basis


@pytest.mark.parametrize("line,rule", [
    ("RuntimeError: NPU out of memory. Tried to allocate 2.57 GiB (NPU 2; 60.96 GiB total capacity; 57.49 GiB already "
     "allocated; 57.49 GiB current active; 1.96 GiB free; 58.12 GiB reserved in total by PyTorch)", "vllm.oom.accelerator"),
    ("torch.OutOfMemoryError: XPU out of memory. Tried to allocate 1.00 GiB.", "vllm.oom.accelerator"),
    ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 12.95 GiB.", "vllm.oom.accelerator"),
    ("RuntimeError: MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.00 GB, max allowed: "
     "18.13 GB). Tried to allocate 256.00 MB on private pool.", "vllm.oom.accelerator"),
    ("RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
     "memory space hbm.", "vllm.oom.xla"),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "vllm.cuda_oom.raw"),
    ("RuntimeError: CUDA error: out of memory", "vllm.cuda_oom.raw"),
    ("RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62", "vllm.oom.cumem"),
])
def test_every_accelerator_wording_is_a_memory_failure(tmp_path, line, rule):
    p = tmp_path / "one.log"
    p.write_text(line + "\n", encoding="utf-8")
    d = diagnose_file(p, RULES, engine="vllm")
    assert d.rule == rule and d.is_memory_failure and d.confidence == "low" and d.phase_basis_kind == "likely"


@pytest.mark.parametrize("line", [
    "INFO 08-16 03:13:02 model_runner.py:1028] CUDA graphs can take additional 1~3 GiB memory per GPU. If you are "
    "running out of memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode.",
    "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
])
def test_decoys_are_not_gpu_memory_failures(tmp_path, line):
    p = tmp_path / "one.log"
    p.write_text(line + "\n", encoding="utf-8")
    assert not diagnose_file(p, RULES, engine="vllm").is_memory_failure


def test_worker_step_called_by_the_driver_takes_the_drivers_start_up_frame():
    # V0 Ray: the worker's traceback shows only execute_model; the driver's shows determine_num_available_blocks
    d = _diag(FG / "vllm-v0p-008.log")
    assert (d.klass, d.phase, d.confidence) == ("profiling_oom", "profiling", "medium")
    assert "calling process" in d.phase_basis


WRAP = LOGS / "vllm-0.11.0-wrapper-formatstrings"


def test_a_relay_that_carries_its_roots_text_is_read_as_the_exception_line():
    # only the engine core's traceback: "RuntimeError: Worker failed with error '<the worker's ValueError text>'"
    d = _diag(WRAP / "relay_only_not_memory.log")
    assert (d.klass, d.rule, d.root.n) == ("not_memory", "vllm.other.worker_exception", 19)
    assert d.confidence == "medium" and not d.is_memory_failure
    # the worker's frames without their exception line: the carried text beats the cut traceback's guess (capture)
    d = _diag(WRAP / "relay_after_cut_worker_frames.log")
    assert (d.klass, d.rule) == ("not_memory", "vllm.other.worker_exception")
    # a carried OOM text: the same OOM rule, placed by the engine core's own frames (determine_available_memory)
    d = _diag(WRAP / "relay_only_oom.log")
    assert (d.klass, d.phase, d.rule, d.phase_basis_kind) == ("profiling_oom", "profiling", "vllm.cuda_oom.torch", "frames")
    # the worker's frames without their exception line, then the relay of its OOM: the worker's (inner) frames place
    # it (capture), not the engine core's RPC frame (initialize_from_config, the KV step)
    d = _diag(WRAP / "relay_after_cut_worker_frames_oom.log")
    assert (d.klass, d.phase, d.phase_basis_kind, d.confidence) == ("cuda_graph_oom", "cuda_graph", "frames", "medium")
    assert "Worker_TP1" in d.phase_basis


def test_the_real_exception_line_stays_the_root_when_the_log_prints_it():
    d = _diag(WRAP / "relay_with_worker_exception.log")
    text = (WRAP / "relay_with_worker_exception.log").read_text(encoding="utf-8").splitlines()
    assert d.rule == "vllm.other.exception" and "ValueError: CUDAGraphMode.FULL" in text[d.root.n - 1]
    assert "Worker_TP0" in text[d.root.n - 1]
    d = _diag(LOGS / "vllm-0.11.0-formatstrings" / "tp2_one_rank_oom.log")
    assert "(Worker_TP1" in (LOGS / "vllm-0.11.0-formatstrings" / "tp2_one_rank_oom.log").read_text(
        encoding="utf-8").splitlines()[d.root.n - 1]


def test_a_relay_with_an_empty_text_stays_cascade_only(tmp_path):
    # str(AssertionError()) is '': the relay says nothing about the root
    p = tmp_path / "empty.log"
    p.write_text("RuntimeError: Worker failed with error '', please check the stack trace above for the root cause\n",
                 encoding="utf-8")
    d = diagnose_file(p, RULES, engine="vllm")
    assert d.klass == "cascade_only" and d.rule == "vllm.cascade.worker_failed"


def test_v0_engine_dead_error_carries_the_repr_of_the_engine_loops_error():
    # the tail of a request's traceback: MQEngineDeadError's text ends with repr(original); before, cascade_only
    d = _diag(LOGS / "vllm-0.8.5-wrapper-formatstrings" / "mq_engine_dead_repr.log")
    assert (d.klass, d.rule, d.root.n, d.engine) == ("not_memory", "vllm.other.exception", 7, "vllm")


def test_a_front_ends_own_traceback_that_ends_in_its_wrapper_is_no_cut_traceback():
    # the API server's output_handler traceback, complete, ends in EngineDeadError: its frames are the wrapper's
    # own stack, not a root's; before, they were read as a cut traceback in serving: runtime_oom (held-out set 2)
    log = LOGS / "vllm-0.11.0-formatstrings" / "engine_dead_wrapper_only.log"
    d = _diag(log)
    assert (d.klass, d.phase) == ("cascade_only", "none")
    assert not d.is_memory_failure
    # the same traceback cut before its exception line is still read by its frames (confidence low)
    cut = _lines(log, lambda t: "EngineDeadError" not in t and "HTTP/1.1\" 500" not in t)
    d = diagnose_lines(cut, RULES, SourceInfo(str(log)))
    assert (d.klass, d.rule, d.confidence) == ("runtime_oom", "vllm.traceback.cut", "low")


def test_frames_in_a_logged_stack_are_not_a_cut_traceback():
    # torch's own logging (TorchLogsFormatter: "[rank0]:I<mmdd> <time> <pid> <path>:<line>] ") prints a stack at
    # INFO level; the engine's real error comes later. The logged frames are no root (held-out set 2: they won
    # over an AssertionError and made it sampler_warmup_oom)
    log = LOGS / "vllm-0.11.0-formatstrings" / "runtime_oom.log"
    frames = _lines(log, lambda t: "[core.py:710]   File " in t or "[core.py:710]     " in t)
    assert len(frames) > 6
    logged = [(n, "[rank0]:I1202 09:15:41.567000 1037 torch/_dynamo/convert_frame.py:1701] " + t.split("[core.py:710] ", 1)[1])
              for n, t in frames]
    d = diagnose_lines(logged, RULES, SourceInfo(str(log)))
    assert d.root is None and not d.is_memory_failure
    # with the same frames under the engine's ERROR records (a traceback cut before its exception line) they count
    d = diagnose_lines(frames, RULES, SourceInfo(str(log)))
    assert d.rule == "vllm.traceback.cut" and d.is_memory_failure


def test_a_paste_of_only_the_servers_500_answers_says_the_cause_is_above_them(tmp_path):
    # the access-log lines of a real served runtime OOM (S1), without the engine core's traceback before them
    src = LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log"
    lines = [t for t in src.read_text(encoding="utf-8").splitlines() if '" 500 Internal Server Error' in t]
    assert len(lines) >= 5
    p = tmp_path / "answers.log"
    p.write_text("\n".join(lines[:5]) + "\n", encoding="utf-8")
    d = diagnose_file(p, RULES)
    assert (d.klass, d.rule, d.engine) == ("cascade_only", "vllm.cascade.server_error_answers", "vllm")
    c = d.classification()
    assert "before the first 500" in c["root_cause_in"] and "EngineCore" in c["root_cause_in"]
    # the answers are the evidence (it had said "no line of the log matched a rule")
    assert [e["role"] for e in d.evidence][:1] == ["cascade"] and '" 500' in d.evidence[0]["text"]
    # in the whole log the OOM before them stays the root
    whole = _diag(src)
    assert (whole.klass, whole.phase) == ("runtime_oom", "runtime")


def test_a_launch_failure_after_torchs_out_of_memory_warnings_keeps_its_class_and_says_memory_ran_out():
    d = _diag(LOGS / "cxx-terminate-quoted" / "launch_failure_after_oom_warnings.log")
    assert d.klass == "not_memory" and "unspecified launch failure" in d.root.line.text
    assert d.confidence == "medium"          # its own line names its cause; the memory that ran out may be it
    note = next(n for n in d.notes if "CUDA warning: out of memory" in n)
    assert note.startswith("4 torch warning(s)") and "(in destroyEvent)" in note and "lines 2-5" in note
    # the same error without the warnings: no such note
    clean = _diag(LOGS / "cxx-terminate-quoted" / "cuda_error_what.log")
    assert clean.klass == "not_memory" and not any("CUDA warning" in n for n in clean.notes)


@pytest.mark.parametrize("case", ["vllm-v1-014", "vllm-v1-016", "vllm-v1-037"])
def test_the_exception_line_is_the_root_not_the_source_line_that_raises_it(case):
    # 'raise ValueError("No available memory for the cache blocks. "' then 'ValueError: No available memory ...'
    d = _diag(FG / f"{case}.log")
    lines = (FG / f"{case}.log").read_text(encoding="utf-8").splitlines()
    assert any("raise " in t for t in lines[d.root.n - 4:d.root.n - 1]) and not d.root.line.msg.lstrip().startswith("raise ")
    assert "Error: " in d.root.line.msg


def test_a_cut_tracebacks_evidence_is_its_innermost_frame():
    # vllm-v1-002: rank 5's traceback cut after get_model: the evidence had been the outer worker_main frame
    d = _diag(FG / "vllm-v1-002.log")
    assert (d.klass, d.rule) == ("weights_load_oom", "vllm.traceback.cut")
    assert "in get_model" in d.root.line.text


def test_the_500_only_pastes_first_screen_says_once_where_the_cause_is_with_the_commands(tmp_path):
    from oomdoctor.card.incident import diagnose_log
    from oomdoctor.diagnose.screen import first_screen

    src = LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log"
    p = tmp_path / "answers.log"
    p.write_text("\n".join(t for t in src.read_text(encoding="utf-8").splitlines() if '" 500 Internal' in t) + "\n",
                 encoding="utf-8")
    card, _, _ = diagnose_log(p, no_card=True, no_device=True)
    text = "\n".join(first_screen(dict(card), None, 80))
    assert text.count("Fetch") == 1 and "note: the root cause is not in this paste" not in text
    assert "journalctl -u <unit> --no-pager" in text and "…" not in text.split("Evidence")[0]
