"""A generic exception line (no rule knows it, no memory class) after which its process went on to a later start-up
step is one a library caught and logged, not the failure (held-out set 9: xformers' optional-import traceback,
"ModuleNotFoundError: No module named 'triton'", before vLLM 0.6.1 loaded its weights, sized its blocks and captured
its graphs, was called the log's not_memory root). A restart that begins again from the first step keeps it.

The logs are real ones (vllm-0.25.1-h200/A_pass.log, a start that served) with xformers' own logged
traceback (as the set-9 paste quotes it) put at a place of the start, as a library import at that moment prints it."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules

LOG = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-0.25.1-h200" / "A_pass.log"
RULES = default_rules()
CAUGHT = [
    "WARNING:xformers:A matching Triton is not available, some optimizations will not be enabled",
    "Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.10/dist-packages/xformers/__init__.py", line 57, in _is_triton_available',
    "    import triton  # noqa",
    "ModuleNotFoundError: No module named 'triton'",
]


def _with(lines_at: int, extra: list[str], tmp_path: Path) -> Path:
    lines = LOG.read_text(encoding="utf-8").splitlines()
    out = lines[:lines_at] + extra + lines[lines_at:]
    p = tmp_path / "a.log"
    p.write_text("\n".join(out) + "\n", encoding="utf-8")
    return p


def test_an_exception_the_start_went_on_past_is_no_root(tmp_path):
    d = diagnose_file(_with(28, CAUGHT, tmp_path), RULES)     # before "Loading weights took", "Model loading took"
    assert d.klass == "unknown" and d.root is None, (d.klass, d.rule)
    assert d.phase_reached == diagnose_file(LOG, RULES).phase_reached


def test_the_same_exception_at_the_end_of_the_log_is_the_root(tmp_path):
    lines = len(LOG.read_text(encoding="utf-8").splitlines())
    d = diagnose_file(_with(lines, CAUGHT, tmp_path), RULES)
    assert (d.klass, d.rule) == ("not_memory", "vllm.other.exception")


def test_a_restart_from_the_first_step_keeps_the_first_runs_exception(tmp_path):
    # the first run dies after its weights loaded; the whole start again after it (its later steps go further)
    lines = LOG.read_text(encoding="utf-8").splitlines()
    p = tmp_path / "restart.log"
    p.write_text("\n".join(lines[:30] + CAUGHT + lines) + "\n", encoding="utf-8")
    d = diagnose_file(p, RULES)
    assert (d.klass, d.rule) == ("not_memory", "vllm.other.exception")


def test_an_exception_before_any_step_then_the_start_is_no_root(tmp_path):
    # an optional import's failure logged as the process starts (vLLM on a TPU host: "Failed to import from vllm._C:
    # ImportError('libcuda.so.1: cannot open shared object file: ...')"), then the start's steps
    d = diagnose_file(_with(0, CAUGHT, tmp_path), RULES)
    assert d.klass == "unknown" and d.root is None, (d.klass, d.rule)
