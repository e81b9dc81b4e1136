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
    # each: what is diagnosed instead, and why no general rule can read the case's class out of this text
    "vllm-v1-006": "diagnosed cascade_only/none/vllm: the paste is one wrapper line ('Engine core initialization "
                   "failed. Failed core proc(s): {}') and no root line; a wrapper-only paste is cascade_only by the "
                   "contract. The case's weights_load_oom comes from the PR's subject (UMA weight loading), not a line",
    "vllm-v1-012": "diagnosed unknown/none/vllm: no exception line and no memory word (the OOM is in the title). The "
                   "frames left are torch.compile's (_dynamo eval_frame _fn, fx graph_module __call__, <eval_with_key> "
                   "forward), which run in the profiling pass, in graph capture and in serving alike; the vLLM frames "
                   "that would place it are cut, and no milestone or serving line comes before it",
    "vllm-v1-017": "diagnosed weights_load_oom/weights_load/vllm: the paste joins two runs (EngineCore pid 45102, then "
                   "pid 47210 19 minutes later): first a HIP OOM with no frame or milestone, then a kv_capacity "
                   "ValueError. The first cause wins; the run the case means is the thread's choice, not the text's",
    "vllm-v1-027": "diagnosed weights_load_oom/weights_load/vllm (likely, low): after the HTML rendering only the XPU "
                   "OOM line with rounded figures is left. No frame, milestone or serving line shows the phase (the "
                   "long prefill is in the report's heading, which is prose), so the bare OOM gets its likely phase",
    "vllm-v1-030": "diagnosed unknown/none/None: the only lines ('Preempted request ... has been resumed!', 'Resumed "
                   "request ... has N computed tokens', LMCache INFO) come from a debug-instrumented scheduler. Stock "
                   "vLLM prints neither (scheduler.py of 0.8.5, 0.9.2, 0.11.0 and 0.25.1 read) and V1 has no "
                   "per-preemption line, so a rule for them would match lines the engine does not print",
    "vllm-v0p-020": "diagnosed unknown/none/vllm: no error line. The log ends after V0's capture notices, which every "
                    "healthy start prints too (the 'CUDA graphs can take additional 1~3 GiB ... If you are running "
                    "out of memory' hint included), so it reads as a clean start cut by the paste; the OOM is in the "
                    "reporter's words",
    "vllm-v0p-024": "diagnosed runtime_oom/runtime/None (likely, low; class and phase right, engine not): a bare traceback tail into ipex_llm/transformers/low_bit_linear.py "
                    "(ipex-llm's model layers, also used without vLLM) and the XPU OOM line. Nothing names vLLM, and a "
                    "layer's forward runs in profiling and in serving alike, so neither the engine nor the phase is in "
                    "the text",
    "vllm-v0p-032": "diagnosed not_memory/none/vllm: the assertion is V0's profiling-consistency check (vllm_ascend "
                    "v0.7.1rc1 worker.py:233-238, assert peak_memory > 0: free memory rose during profiling, here by "
                    "258,048 B). vllm.other.profiling_inconsistent calls that same check not_memory in every build; the "
                    "case's free_memory_below_utilization is an analogy that the case itself marks uncertain",
    "vllm-v0p-035": "diagnosed weights_load_oom/weights_load/vllm (likely, low): a bare 'torch.OutOfMemoryError: XPU "
                    "out of memory.' with no figures. The ample free memory and the 1-element tensor are only in the "
                    "user's own python -c command and its printed mem_get_info() tuple, which no engine prints, so the "
                    "text reads as an out-of-memory error",
    "oe-009": "diagnosed runtime_oom/runtime/None (likely, low; class and phase right, engine not): one torch/_ops.py frame and torch_npu's OOM line. Nothing names SGLang (the "
              "same line comes from vllm-ascend or any torch_npu program), and no frame, milestone or serving line "
              "shows the phase",
    "oe-019": "diagnosed unknown/none/None: the one line is llama.cpp's LLAMA_LOG_WARN from resolve_fused_ops "
              "(src/llama-context.cpp). After it the fused op is disabled and start-up goes on; it has no memory "
              "word, and reading it as an OOM would call every partial offload a failure",
    "oe-040": "diagnosed unknown/none/tgi: only success milestones (the warm-up done, 'Setting max batch total tokens'). "
              "The runtime OOM is in the reporter's screenshots, not in the text, and a clean log is never an OOM",
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
