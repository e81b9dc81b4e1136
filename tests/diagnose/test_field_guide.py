"""Every field-guide case (fixtures/logs/field-guide/, one rendered paste per real incident) is diagnosed to the
class, phase and engine of its ROOT failure (expected.yaml: the facts of the case). ``clean`` cases must come out
``unknown`` with no root: a clean log is never an OOM.

NOT_YET lists the cases oomdoctor does not classify right today, each with what it does instead and the paste's
shape; they are strict xfails, so a fix that makes one right fails here until its entry is removed. Many of them
belong to other engines' rules (oe-*: TGI, Ollama, TensorRT-LLM, lmdeploy, SGLang, llama.cpp are another issue).
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
    "vllm-v1-012": "diagnosed unknown/none/vllm: two ranks (0, 7) interleaved line by line, VllmWorker prefix + ERROR tag, only compiled-gr",
    "vllm-v1-017": "diagnosed weights_load_oom/weights_load/vllm: Lemonade re-log: own timestamp + [Error]/[Info] + (Process) before the vLLM EngineCore pre",
    "vllm-v1-021": "diagnosed unknown/none/vllm: hand-condensed log with bracketed '[... N similar ...]' notes and '...' progress bars, Wor",
    "vllm-v1-027": "diagnosed weights_load_oom/weights_load/vllm: HTML-rendered, paraphrased report (error class, function names, rounded figures), no raw l",
    "vllm-v1-030": "diagnosed unknown/none/None: EngineCore_0 INFO lines from a debug-instrumented scheduler interleaved with LMCache's own",
    "vllm-v0p-020": "diagnosed unknown/none/vllm: per-worker milestones through CUDA-graph capture notices, no exception line (log ends in c",
    "vllm-v0p-024": "diagnosed weights_load_oom/weights_load/vllm: bare traceback tail, ipex-llm low_bit_linear frame, XPU OOM wording, nothing else",
    "vllm-v0p-032": "diagnosed not_memory/none/vllm: reporter's single [rank0] AssertionError line, then commenter's 0.0000 GB weights mileston",
    "vllm-v0p-035": "diagnosed weights_load_oom/weights_load/vllm: torch one-liner reproduction in a container shell, device_count 2, ample free memory, XPU ",
    "oe-001": "diagnosed not_memory/none/sglang: router init-state traceback + cut Process-1 start, no milestones",
    "oe-003": "diagnosed not_memory/none/sglang: tail: one load milestone + ValueError cut mid-word",
    "oe-004": "diagnosed unknown/none/sglang: inner traceback fragment, exception name cut",
    "oe-005": "diagnosed unknown/none/sglang: overlap-thread traceback tail, CUDA error at stream switch",
    "oe-007": "diagnosed unknown/none/None: tokenizer warning decoy + admission error line",
    "oe-008": "diagnosed admission_rejection/admission/vllm: client-side HTTP body with Bad Request prefix",
    "oe-009": "diagnosed weights_load_oom/weights_load/vllm: tail: one torch frame + NPU OOM line",
    "oe-012": "diagnosed cascade_only/none/sglang: bracket-timestamp prefix, Triton shared-memory error, sigquit, shell Killed",
    "oe-014": "diagnosed not_memory/none/sglang: TP-prefixed scheduler traceback, draft-worker balance check",
    "oe-016": "diagnosed unknown/none/llamacpp: docker-compose prefix, triplet repeated, no milestones",
    "oe-017": "diagnosed unknown/none/None: router child [port] + uptime/level prefix, error line cut",
    "oe-018": "diagnosed unknown/none/llamacpp: uptime/level prefix, context milestones to failed alloc",
    "oe-019": "diagnosed unknown/none/None: single device-assignment message, no memory word",
    "oe-021": "diagnosed not_memory/none/llamacpp: unprefixed llama.cpp load tail + webui ERROR and AttributeError",
    "oe-022": "diagnosed not_memory/none/None: webui INFO prefix, file-format error + same AttributeError",
    "oe-023": "diagnosed unknown/none/None: clean per-layer KV placement lines",
    "oe-024": "diagnosed unknown/none/None: ggml arena overflow line + shell segfault",
    "oe-025": "diagnosed unknown/none/None: CLI wrapper error + journald metadata lines",
    "oe-026": "diagnosed unknown/none/None: CLI error block (ROCm, CUDA wording) + journald context setup",
    "oe-027": "diagnosed cuda_graph_oom/cuda_graph/vllm: CLI only: cuBLAS alloc failure",
    "oe-028": "diagnosed unknown/none/None: journald (no host, lowercase month) offload line, NOT_INITIALIZED",
    "oe-029": "diagnosed unknown/none/llamacpp: runner stderr + Go panic + INFO not-responding loop",
    "oe-030": "diagnosed unknown/none/None: CLI error + journald systemd/server-config lines",
    "oe-031": "diagnosed unknown/none/None: journald CJK month, WARN + INFO Load failed (host RAM)",
    "oe-032": "diagnosed unknown/none/None: single offload line wrapped across lines, no failure",
    "oe-033": "diagnosed unknown/none/None: SYCL device table + OUT_OF_HOST_MEMORY exception",
    "oe-034": "diagnosed unknown/none/None: launcher Args dump + old total-tokens warmup message",
    "oe-035": "diagnosed unknown/none/None: command + launcher ERROR header + cut shard traceback",
    "oe-036": "diagnosed weights_load_oom/weights_load/vllm: compose + launcher timestamp prefix, warmup OOM traceback tail",
    "oe-037": "diagnosed cuda_graph_oom/cuda_graph/None: torch graph capture_end tail + router CANCELLED per shard",
    "oe-038": "diagnosed unknown/none/None: shard stderr warnings + serve traceback cut at FlashLlama",
    "oe-039": "diagnosed not_memory/none/None: client-side validation error line",
    "oe-040": "diagnosed unknown/none/None: success milestones only, runtime death not in text",
    "oe-041": "diagnosed not_memory/none/None: client-side validation error line (Gaudi)",
    "oe-042": "diagnosed unknown/none/None: one flattened escaped string (endpoint UI)",
    "oe-043": "diagnosed not_memory/none/None: executor component ledger, no traceback",
    "oe-044": "diagnosed unknown/none/None: TRT-LLM ERROR line + C++ numbered stack",
    "oe-045": "diagnosed unknown/none/None: three INFO lines, clean",
    "oe-046": "diagnosed unknown/none/None: TRT builder E lines + wrapper, traceback start",
    "oe-047": "diagnosed unknown/none/None: commands + Triton model-load error line",
    "oe-048": "diagnosed not_memory/none/None: GEMM warning decoy + thread exception",
    "oe-049": "diagnosed unknown/none/None: C++ terminate line, no Python",
    "oe-050": "diagnosed not_memory/none/None: single RuntimeError line",
    "oe-051": "diagnosed unknown/none/None: per-request WARNING interleaved with uvicorn access lines",
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
