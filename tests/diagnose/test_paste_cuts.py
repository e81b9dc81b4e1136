"""Real H200 logs cut the way people paste them (tools/shapes/cuts.py): every cut reads as its log, and what a
bare line or a cut traceback still says decides the phase (issue 12)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import build_rule, default_rules
from oomdoctor.errors import RuleError
from oomdoctor.levers import engine as levermod

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "fixtures" / "logs"
RULES = default_rules()


def _cuts():
    spec = importlib.util.spec_from_file_location("shape_cuts", ROOT / "tools" / "shapes" / "cuts.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["shape_cuts"] = mod          # its dataclass is resolved through its module
    spec.loader.exec_module(mod)
    return mod


def _one(tmp_path: Path, name: str, lines: list[str]):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return diagnose_file(p, RULES)


def _line(log: str, needle: str) -> str:
    return next(t for t in (LOGS / log).read_text(encoding="utf-8").splitlines() if needle in t)


# cuts read wrong today, each with why (strict: a fix must remove it from here). P2's tail80 was one: V2's
# _dummy_run → execute_model frames without profile_run above them read as runtime; _dummy_run is now a fallback
# start-up frame (vllm.frame.dummy_run)
KNOWN_MISSES: set[tuple[str, str]] = set()


def test_every_cut_of_every_real_log_reads_as_its_log():
    res = _cuts().run(LOGS)
    assert res["cuts"] >= 370
    missed = {(r["log"], r["cut"]) for r in res["rows"] if r["miss"] and not r["miss"].startswith("guess:")}
    assert missed == KNOWN_MISSES
    # what is guessed shows no phase at all (no frame of its own process, milestone, serving line or serving caller),
    # and says so: confidence low
    for r in res["rows"]:
        if r["miss"].startswith("guess:"):
            assert r["basis"] == "likely" and "confidence low" in r["miss"], r
    assert res["guessed"] <= 23        # 18 of the 23 logs before the dawn serve logs; S1, S2 and W1 add their bare lines


def test_memory_in_cuda_graph_pools_rules_out_the_phases_before_capture(tmp_path):
    # the real F1b OOM line alone: "with 34.00 MiB allocated in private pools (e.g., CUDA Graphs)" -> graphs exist
    d = _one(tmp_path, "f1b_line.log", [_line("vllm-0.25.1-h200/F1b_fail.log", "torch.OutOfMemoryError: CUDA out")])
    assert (d.klass, d.phase, d.phase_basis_kind, d.confidence) == ("cuda_graph_oom", "cuda_graph", "likely", "low")
    assert "cuda_graph_pools_bytes" in d.phase_basis and d.numbers["cuda_graph_pools_bytes"] == 34 * 2**20
    # the weights OOM line of C2 has no graph memory: the rule's plain most likely phase
    d = _one(tmp_path, "c2_line.log", [_line("vllm-0.25.1-h200/C2_fail.log", "torch.OutOfMemoryError: CUDA out")])
    assert (d.klass, d.phase_basis_kind) == ("weights_load_oom", "likely")
    assert "cuda_graph_pools_bytes" not in d.phase_basis


def test_compile_or_warm_up_alone_stands_for_capture_with_confidence_medium(tmp_path):
    cuts = _cuts()
    lines = cuts.engine_lines((LOGS / "vllm-0.25.1-h200" / "F1b_fail.log").read_text(encoding="utf-8"))
    full = cuts.diagnose(lines, "F1b_fail.log", RULES)
    assert (full.klass, full.confidence) == ("cuda_graph_oom", "high") and "vllm.frame.capture" in full.phase_basis
    # 30 lines either side of the root: the re-raised traceback after it is cut below compile_or_warm_up_model,
    # whose own line names the call it made ('cuda_graph_memory_bytes = self.model_runner.capture_model()')
    window = next(c for c in cuts.cuts_of(lines, full.root.n - 1) if c.name == "window30")
    assert window.lines[-1].endswith("= self.model_runner.capture_model()")
    d = _one(tmp_path, "f1b_window.log", window.lines)
    assert (d.klass, d.phase, d.phase_basis_kind, d.confidence) == ("cuda_graph_oom", "cuda_graph", "frames", "high")
    assert "vllm.frame.capture" in d.phase_basis
    # without that line, compile_or_warm_up_model alone: capture, said with medium confidence
    d = _one(tmp_path, "f1b_window_cut.log", window.lines[:-1])
    assert (d.klass, d.phase, d.phase_basis_kind, d.confidence) == ("cuda_graph_oom", "cuda_graph", "frames", "medium")
    assert "vllm.frame.compile_or_warm_up" in d.phase_basis


def test_a_dummy_run_alone_is_a_start_up_forward_and_yields_to_any_other_start_up_frame(tmp_path):
    cuts = _cuts()
    lines = cuts.engine_lines((LOGS / "vllm-0.25.1-h200-night" / "P2_profile_eager.log").read_text(encoding="utf-8"))
    d = _one(tmp_path, "p2_tail80.log", lines[-80:])          # _dummy_run → execute_model, profile_run cut off
    assert (d.klass, d.phase, d.confidence) == ("profiling_oom", "profiling", "medium")
    assert "vllm.frame.dummy_run" in d.phase_basis
    # capture_model → _capture_cudagraphs → _dummy_run (0.11.0's own frames): the capture frame decides
    d = diagnose_file(LOGS / "vllm-0.11.0-formatstrings" / "cuda_graph_oom.log", RULES)
    assert d.klass == "cuda_graph_oom" and "vllm.frame.capture" in d.phase_basis


def test_a_serving_callers_traceback_places_a_bare_oom_at_runtime(tmp_path):
    # the real R1g tail: the engine core's frames are its model's layers only; the caller's traceback after it is
    # LLM.generate → _run_engine → step → get_output → EngineDeadError: the engine was serving
    cuts = _cuts()
    lines = cuts.engine_lines((LOGS / "vllm-0.25.1-h200-night" / "R1g_runtime.log").read_text(encoding="utf-8"))
    d = _one(tmp_path, "r1g_tail.log", lines[-40:])
    assert (d.klass, d.phase, d.phase_basis_kind, d.confidence) == ("runtime_oom", "runtime", "frames", "medium")
    assert "calling process" in d.phase_basis
    # a start-up caller (P2: LLM.__init__ → wait_for_engine_startup) says nothing of the phase: the rule's guess
    lines = cuts.engine_lines((LOGS / "vllm-0.25.1-h200-night" / "P2_profile_eager.log").read_text(encoding="utf-8"))
    d = _one(tmp_path, "p2_tail.log", lines[-40:])
    assert d.phase_basis_kind == "likely" and d.klass != "runtime_oom"


def test_torch_compiles_autotuning_oom_names_its_phase_and_ranks_eager_mode(tmp_path):
    log = LOGS / "vllm-0.25.1-h200-evening" / "P1_profile.log"
    full = diagnose_file(log, RULES)
    assert (full.klass, full.phase, full.rule) == ("autotuner_oom", "autotune", "vllm.cuda_oom.inductor_autotune")
    d = _one(tmp_path, "p1_line.log", [_line("vllm-0.25.1-h200-evening/P1_profile.log",
                                            "Failed to run autotuning code block: CUDA out of memory")])
    assert (d.klass, d.phase_basis_kind, d.confidence) == ("autotuner_oom", "message", "high")
    assert d.numbers["compile_autotune_tried_bytes"] == 60 * 2**20
    ids = [lv["id"] for lv in levermod.propose(d.klass, d.numbers, engine="vllm")]
    assert ids[:2] == ["free_other_processes", "enforce_eager"], ids
    # a kernel library's autotuner (no torch.compile figure): smaller chunks first, no eager mode
    other = diagnose_file(LOGS / "vllm-0.33.0-formatstrings" / "autotuner_oom.log", RULES)
    assert other.klass == "autotuner_oom" and "compile_autotune_tried_bytes" not in other.numbers
    ids = [lv["id"] for lv in levermod.propose(other.klass, other.numbers, engine="vllm")]
    assert "enforce_eager" not in ids and "max_num_batched_tokens" in ids


@pytest.mark.parametrize("when,msg", [
    ([{"number": "no_such_bytes", "phase": "cuda_graph"}], "not one of the rule's numbers"),
    ([{"number": "pools_bytes", "phase": "autotune"}], "not a phase of its class_by_phase"),
    ([{"number": "pools_bytes"}], "list of"),
    ({"number": "pools_bytes", "phase": "cuda_graph"}, "list of"),
])
def test_likely_when_is_checked(when, msg):
    rule = {"id": "vllm.t.x", "engine": "vllm", "role": "root", "likely_phase": "weights_load", "likely_when": when,
            "class_by_phase": {"weights_load": "weights_load_oom", "cuda_graph": "cuda_graph_oom"},
            "patterns": ["Out of memory, (?P<pools>\\d+ MiB) in pools"], "numbers": {"pools_bytes":
                                                                                 {"group": "pools", "unit": "size"}}}
    with pytest.raises(RuleError, match=msg):
        build_rule(rule, Path("t.yaml"), "vllm")


def test_another_process_in_a_start_up_step_is_no_serving_caller(tmp_path):
    # a bare OOM line of one rank, then another process's traceback that runs execute_model inside profile_run
    # (the real P2 frames, without a prefix): that serving frame is a start-up dummy run, not a caller serving
    cuts = _cuts()
    p2 = cuts.engine_lines((LOGS / "vllm-0.25.1-h200-night" / "P2_profile_eager.log").read_text(encoding="utf-8"))
    frames = [ln.split("] ", 1)[1] if "] " in ln else ln for ln in p2
              if 'File "' in ln and ("profile_run" in ln or "_dummy_run" in ln or "execute_model" in ln)]
    assert any("profile_run" in f for f in frames) and any("execute_model" in f for f in frames)
    oom = _line("vllm-0.25.1-h200-night/P2_profile_eager.log", "torch.OutOfMemoryError: CUDA out of memory")
    lines = ["(VllmWorker rank=1 pid=7) " + oom.split("] ", 1)[1], "Traceback (most recent call last):"] + frames
    d = _one(tmp_path, "rank_then_startup.log", lines)
    assert d.phase_basis_kind == "likely" and d.klass != "runtime_oom"


def test_a_server_s_report_right_after_the_error_places_it_at_runtime(tmp_path):
    # the real `vllm serve` runtime OOM cut from its exception line on: no frame, no milestone before it, but the API
    # server's "AsyncLLM output_handler failed." and the 500s of the requests it was serving follow at once
    lines = (LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log").read_text(encoding="utf-8").splitlines()
    i = next(i for i, t in enumerate(lines) if "torch.OutOfMemoryError: CUDA out of memory" in t)
    d = _one(tmp_path, "s1_from_root.log", lines[i:])
    assert (d.klass, d.phase, d.phase_basis_kind, d.confidence) == ("runtime_oom", "runtime", "serving", "medium")
    assert "output handler" in d.phase_basis and "right after the error" in d.phase_basis
    # the same lines before a start-up failure do not happen: an error far before the first serving line says nothing
    far = [lines[i]] + ["(EngineCore pid=1570) INFO 12-02 02:33:38 [x.py:1] waiting"] * 50 + lines[i + 1:]
    assert _one(tmp_path, "s1_far.log", far).phase_basis_kind == "likely"
