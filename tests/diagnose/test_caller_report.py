"""A caller's report right after an error that nothing before it places (``phase.caller_report``): a cascade rule
with ``reaches`` names the step the error ended — llama-bench's "failed to create context with model" after a
cudaMalloc failure: the weights were loaded, the context's compute buffers failed."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules
from oomdoctor.diagnose.phase import CALLER_LINES

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "llamacpp-0.2.90-formatstrings"
RULES = default_rules()
LINES = (FIX / "bench_compute_buffer_oom.log").read_text(encoding="utf-8").splitlines()
REPORT = LINES[-1]


def _diag(tmp_path: Path, lines: list[str]):
    p = tmp_path / "x.log"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return diagnose_file(p, RULES)


def test_the_context_report_places_the_allocation_failure_before_it():
    d = diagnose_file(FIX / "bench_compute_buffer_oom.log", RULES)
    assert (d.klass, d.phase, d.phase_basis_kind, d.confidence) == ("profiling_oom", "profiling", "frames", "medium")
    assert "caller's report at line 8" in d.phase_basis


def test_without_the_report_the_phase_is_only_likely(tmp_path):
    d = _diag(tmp_path, LINES[:-1])
    assert (d.klass, d.phase_basis_kind, d.confidence) == ("weights_load_oom", "likely", "low")


def test_a_report_far_after_the_error_says_nothing_of_it(tmp_path):
    d = _diag(tmp_path, LINES[:-1] + ["ggml_cuda_init: found 1 CUDA devices:"] * CALLER_LINES + [REPORT])
    assert d.phase_basis_kind == "likely"


def test_a_load_report_places_it_in_the_weights(tmp_path):
    d = _diag(tmp_path, LINES[:-1] + ["llama_load_model_from_file: failed to load model"])
    assert (d.klass, d.phase, d.phase_basis_kind) == ("weights_load_oom", "weights_load", "frames")
