"""Every field-guide case (fixtures/logs/field-guide/, one rendered paste per real incident) is diagnosed to the
class, phase and engine of its ROOT failure (expected.yaml: the facts of the case). ``clean`` cases must come out
``unknown`` with no root: a clean log is never an OOM.

NOT_YET lists the cases oomdoctor does not classify right today, each with what it does instead and the paste's
shape; they are strict xfails, so a fix that makes one right fails here until its entry is removed. The non-vLLM
cases (oe-*) are tested by engine in tests/engines/test_other_engines.py too.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from oomdoctor import contract
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules

ROOT = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "field-guide"
CASES = yaml.safe_load((ROOT / "expected.yaml").read_text(encoding="utf-8"))
RULES = default_rules()

NOT_YET: dict[str, str] = {
    "vllm-v1-006": "diagnosed cascade_only/none/vllm: wrapper-only single line, no prefix, no traceback, no root line",
    "vllm-v1-012": "diagnosed unknown/none/vllm: two ranks (0, 7) interleaved line by line, VllmWorker prefix + ERROR tag, only compiled-graph frames, no except",
    "vllm-v1-017": "diagnosed weights_load_oom/weights_load/vllm: Lemonade re-log: own timestamp + [Error]/[Info] + (Process) before the vLLM EngineCore prefix,",
    "vllm-v1-027": "diagnosed weights_load_oom/weights_load/vllm: HTML-rendered, paraphrased report (error class, function names, rounded figures), no raw log l",
    "vllm-v1-030": "diagnosed unknown/none/None: EngineCore_0 INFO lines from a debug-instrumented scheduler interleaved with LMCache's own logger format, no er",
    "vllm-v0p-020": "diagnosed unknown/none/vllm: per-worker milestones through CUDA-graph capture notices, no exception line (log ends in capture), capture hint",
    "vllm-v0p-024": "diagnosed unknown/none/None: bare traceback tail, ipex-llm low_bit_linear frame, XPU OOM wording, nothing else",
    "vllm-v0p-032": "diagnosed not_memory/none/vllm: reporter's single [rank0] AssertionError line, then commenter's 0.0000 GB weights milestone and [rank0] swif",
    "vllm-v0p-035": "diagnosed weights_load_oom/weights_load/vllm: torch one-liner reproduction in a container shell, device_count 2, ample free memory, XPU OOM ",
    "oe-009": "diagnosed unknown/none/None: tail: one torch frame + NPU OOM line",
    "oe-019": "diagnosed unknown/none/None: single device-assignment message, no memory word",
    "oe-040": "diagnosed unknown/none/tgi: success milestones only, runtime death not in text",
}


def _params():
    out = []
    for c in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=NOT_YET[c["id"]])] if c["id"] in NOT_YET else []
        out.append(pytest.param(c, id=c["id"], marks=marks))
    return out


def test_every_case_has_its_fixture_and_nothing_else_is_there():
    files = {c["file"] for c in CASES}
    assert len(CASES) == 141 and len(files) == 141
    assert files == {p.name for p in ROOT.glob("*.log")}
    assert not set(NOT_YET) - {c["id"] for c in CASES}, "NOT_YET names a case that does not exist"


@pytest.mark.parametrize("case", _params())
def test_case_is_classified_right(case):
    d = diagnose_file(ROOT / case["file"], RULES)
    klass = "unknown" if case["class"] == "clean" else case["class"]
    assert (d.klass, d.phase, d.engine) == (klass, case["phase"], case["engine"]), \
        f"{case['id']} ({case.get('shape')}): rule {d.rule}, basis {d.phase_basis}"
    if case["class"] == "clean":
        assert d.root is None and not d.is_memory_failure
    if klass not in contract.NO_MEMORY_FAILURE:
        # every memory failure says how its phase was decided and how sure that is
        assert d.phase_basis_kind in ("frames", "message", "milestones", "serving", "likely")
        assert d.confidence in ("high", "medium", "low")
