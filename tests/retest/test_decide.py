"""retest's exit codes agree with docs/contract.md and docs/retest.md; inconclusive decisions on
real logs (the unit under the fake-engine tests in test_inconclusive.py)."""
from __future__ import annotations

from pathlib import Path

from oomdoctor import contract
from oomdoctor.card.incident import diagnose_log
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules
from oomdoctor.retest import inconclusive
from oomdoctor.retest.decide import exit_code
from oomdoctor.retest.launch import RunResult

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"


def test_exit_codes_agree_with_the_docs() -> None:
    assert (contract.EXIT_INCONCLUSIVE, contract.EXIT_PREDICTION) == (3, 4)
    assert [exit_code(o) for o in ("pass", "fail", "regressed", "timeout", "inconclusive", "predicted_pass",
                                   "predicted_fail", "predicted_unknown")] == [0, 1, 1, 1, 3, 4, 4, 4]
    text = " ".join((ROOT / "docs" / "contract.md").read_text().split())
    assert "2 bad input, 3 inconclusive" in text and "4 a twin prediction" in text
    doc = " ".join((ROOT / "docs" / "retest.md").read_text().split())
    assert "3 inconclusive" in doc and "4 a twin prediction" in doc


def rr(log: Path, **kw) -> RunResult:
    return RunResult(kw.get("rc", 1), kw.get("timed_out", False), 1.0, log, None, kw.get("served", False), None, [])


def test_memory_failures_and_served_starts_are_conclusive(tmp_path: Path) -> None:
    card, _, _ = diagnose_log(H200 / "A_fail.log", tmp_path / "a.yaml", no_device=True)
    rules = default_rules()
    assert inconclusive.check(rr(H200 / "A_fail.log"), diagnose_file(H200 / "A_fail.log", rules), card, 60) is None
    assert inconclusive.check(rr(H200 / "A_fail.log", timed_out=True), diagnose_file(H200 / "B_fail.log", rules),
                              card, 60) is None                    # a memory failure in a timed-out run
    assert inconclusive.check(rr(H200 / "A_pass.log", rc=0, served=True), diagnose_file(H200 / "A_pass.log", rules),
                              card, 60) is None


def test_a_start_that_stopped_without_serving_and_without_a_failure_is_inconclusive(tmp_path: Path) -> None:
    card, _, _ = diagnose_log(H200 / "A_fail.log", tmp_path / "a.yaml", no_device=True)
    cut = tmp_path / "cut.log"                   # A_fail up to the weights: the process died there (no error line)
    cut.write_text("".join((H200 / "A_fail.log").read_text().splitlines(keepends=True)[:20]))
    inc = inconclusive.check(rr(cut, rc=-9), diagnose_file(cut, default_rules()), card, 60)
    assert inc is not None and "status -9" in inc.reason and "before kv_reservation" in inc.reason
    # the same start that hung there is a 'timeout' (it reached a phase), not inconclusive
    assert inconclusive.check(rr(cut, rc=None, timed_out=True), diagnose_file(cut, default_rules()), card, 60) is None
