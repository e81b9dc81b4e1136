"""CPython's unraisable report ("Exception ignored in: %R", role ``ignored``): the exception after it is no root, a
failure before or after it stays (diagnose/ignored.py drop_ignored). Lines from fixtures/logs/vllm-accel-formatstrings/."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-accel-formatstrings"
RULES = default_rules()


def _lines(name: str) -> list[str]:
    return [ln for ln in (FIX / name).read_text(encoding="utf-8").splitlines() if not ln.startswith("#")]


def _noise() -> list[str]:
    lines = _lines("unraisable_meta_path_clean.log")
    return lines[next(i for i, ln in enumerate(lines) if ln.startswith("Exception ignored in: ")):]


def _diagnose(tmp_path: Path, lines: list[str]):
    p = tmp_path / "paste.log"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return diagnose_file(p, RULES)


def test_clean_run_with_exit_noise_stays_clean(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, _lines("unraisable_meta_path_clean.log"))
    assert (d.klass, d.root) == ("unknown", None)


def test_failure_after_the_report_stays_the_root(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, _noise() + _lines("hpu_devmem_weights_oom.log"))
    assert (d.klass, d.phase, d.rule) == ("weights_load_oom", "weights_load", "vllm.oom.hpu_devmem")


def test_failure_before_the_report_stays_the_root(tmp_path: Path) -> None:
    d = _diagnose(tmp_path, _lines("hpu_devmem_weights_oom.log") + _noise())
    assert (d.klass, d.rule) == ("weights_load_oom", "vllm.oom.hpu_devmem")


def test_without_the_report_the_exception_is_a_root(tmp_path: Path) -> None:
    lines = [ln for ln in _lines("unraisable_meta_path_clean.log") if not ln.startswith("Exception ignored in: ")]
    d = _diagnose(tmp_path, lines)
    assert d.klass == "not_memory"


def test_report_whose_exception_no_rule_reads_does_not_swallow_a_later_failure(tmp_path: Path) -> None:
    noise = _noise()[:-1] + ["KeyboardInterrupt"]          # an exception line no rule matches
    d = _diagnose(tmp_path, noise + ["INFO 12-01 11:20:00 [core.py:1] x"] * 250 + _lines("hpu_devmem_weights_oom.log"))
    assert d.klass == "weights_load_oom"
