"""A root rule with ``after:`` is a root only when a line of one of the named rules came before it: a line that is a
memory failure by what precedes it (Metal's failed command buffer after buffers beyond the GPU's working set) and
anything else without it."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "llamacpp-0.2.25-formatstrings"
RULES = default_rules()


def _diag(tmp_path: Path, text: str):
    p = tmp_path / "x.log"
    p.write_text(text, encoding="utf-8")
    return diagnose_file(p, RULES)


def test_the_failed_command_buffer_after_the_working_set_warning_is_a_memory_failure():
    d = diagnose_file(FIX / "metal_working_set_oom.log", RULES)
    assert (d.klass, d.rule, d.engine) == ("sampler_warmup_oom", "llamacpp.metal.command_buffer_oom", "llamacpp")
    assert d.phase_basis_kind == "milestones"


def test_without_the_warning_it_is_not(tmp_path):
    d = diagnose_file(FIX / "metal_command_buffer_failed.log", RULES)
    assert (d.klass, d.rule) == ("not_memory", "llamacpp.other.ggml_assert")


def test_the_warning_must_come_before_the_failure(tmp_path):
    lines = (FIX / "metal_working_set_oom.log").read_text(encoding="utf-8").splitlines()
    warned = [ln for ln in lines if "recommended max working set size" in ln]
    rest = [ln for ln in lines if ln not in warned]
    d = _diag(tmp_path, "\n".join(rest + warned) + "\n")      # the warning printed after the failure only
    assert d.klass == "not_memory"


def test_the_rule_reads_the_catalogue_by_id():
    rule = RULES.by_id("llamacpp.metal.command_buffer_oom")
    assert rule.after == ("llamacpp.metal.over_working_set",)
    assert RULES.by_id(rule.after[0]).role == "info"
