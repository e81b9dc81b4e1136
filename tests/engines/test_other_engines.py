"""The engines other than vLLM (SGLang, llama.cpp, Ollama, TGI, TensorRT-LLM, LMDeploy) read from real pastes.

- every non-vLLM case of the field guide (fixtures/logs/field-guide/oe-*.log, facts in expected.yaml) is diagnosed
  to its class, phase and engine; the few that cannot be are strict xfails with the reason;
- on every fixture of those engines the first lever is written in that engine's own flag, and no lever ever
  carries another engine's flag (an SGLang log never gets a vLLM flag);
- the per-engine lever tables (engines/<engine>/levers.yaml) are consistent data, and their arithmetic is checked.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from oomdoctor import contract
from oomdoctor.card.incident import diagnose_log
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.match import choose_engine
from oomdoctor.diagnose.rules import load_rules
from oomdoctor.levers import engine as levermod
from oomdoctor.levers.context import Ctx
from oomdoctor.levers.flags import engine_words, flag_for
from oomdoctor.levers.per_engine import SPEC_KEYS, _spec, engine_table, propose_engine, value_of
from oomdoctor.paths import ENGINES_DIR, rules_dir

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "fixtures" / "logs"
FG = LOGS / "field-guide"
RULESET = load_rules(rules_dir())
CASES = [e for e in yaml.safe_load((FG / "expected.yaml").read_text(encoding="utf-8")) if e["engine"] != "vllm"]
OTHER_ENGINES = ("sglang", "llamacpp", "ollama", "tgi", "tensorrt_llm", "lmdeploy")

# What these pastes do not carry, so that no rule may honestly read the case's class out of them.
NOT_IN_THE_PASTE = {
    "oe-009": "the paste is one torch frame and torch_npu's OOM line: nothing in it names SGLang",
    "oe-019": "llama.cpp's fused-op device-assignment WARN; it says nothing about memory (the case's class comes from "
              "the thread's outcome), so reading it as an OOM would call every partial offload a failure",
    "oe-040": "only success milestones; the runtime OOM is in the reporter's words, not in the log",
}


def _params():
    out = []
    for e in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=NOT_IN_THE_PASTE[e["id"]])] if e["id"] in NOT_IN_THE_PASTE else []
        out.append(pytest.param(e, id=e["id"], marks=marks))
    return out


def test_the_other_engines_cases_are_all_here() -> None:
    engines = {e["engine"] for e in CASES}
    assert engines == set(OTHER_ENGINES)
    assert len(CASES) == 51
    assert set(NOT_IN_THE_PASTE) <= {e["id"] for e in CASES}


@pytest.mark.parametrize("case", _params())
def test_field_guide_case_is_classified(case: dict) -> None:
    d = diagnose_file(FG / case["file"], RULESET)
    want = "unknown" if case["class"] == "clean" else case["class"]
    assert (d.engine, d.klass, d.phase) == (case["engine"], want, case["phase"]), \
        f"{case['id']} ({case['shape']}): rule {d.rule}, {d.phase_basis}"
    assert d.is_memory_failure == (want not in contract.NO_MEMORY_FAILURE)


def test_a_clean_paste_is_never_an_oom() -> None:
    clean = [e for e in CASES if e["class"] == "clean"]
    assert len(clean) == 5
    for e in clean:
        d = diagnose_file(FG / e["file"], RULESET)
        assert d.root is None and d.klass == "unknown", e["id"]


# ----------------------------------------------------------------------------- levers in the engine's words
def _fixtures_of(engine: str) -> list[Path]:
    own = sorted(p for d in LOGS.iterdir() if d.is_dir() and d.name.split("-")[0] == engine for p in d.glob("*.log"))
    return own + [FG / e["file"] for e in CASES if e["engine"] == engine]


def _words(engine: str) -> set[str]:
    """The flag / option / variable names an engine's table writes (the text before the value)."""
    out = set()
    for words in engine_words(engine).values():
        for style in ("serve", "offline", "env"):
            if style in words:
                out.add(str(words[style]).split("{value}")[0].split("=")[0].strip())
    return out


def _speaks(flag: str, name: str) -> bool:
    """``flag`` sets the setting ``name`` writes (``--tp 2`` is ``--tp``'s, ``--tp-size 2`` is not)."""
    return bool(name) and flag.startswith(name) and (len(flag) == len(name) or flag[len(name)] in " =(")


ENGINE_FIXTURES = [pytest.param(e, p, id=f"{e}:{p.parent.name}/{p.name}") for e in OTHER_ENGINES for p in _fixtures_of(e)]


@pytest.mark.parametrize("engine,log", ENGINE_FIXTURES)
def test_first_lever_is_the_engines_own_flag(engine: str, log: Path) -> None:
    card, _, d = diagnose_log(log, no_card=True, no_device=True)
    if not d.is_memory_failure:
        assert not card["levers"], f"{log.name}: levers for a {d.klass} diagnosis"
        return
    if d.engine != engine:
        pytest.skip(f"{log.name}: detected as {d.engine} (see test_field_guide_case_is_classified)")
    levers = card["levers"]
    assert levers, f"{log.name}: a {d.klass} diagnosis without a lever"
    first = levers[0]
    if first["id"] == "free_other_processes" and d.klass == "free_memory_below_utilization":
        # the engine's start-up check failed because another process holds memory: stopping it comes first
        assert first["applies_as"] == "process"
        first = levers[1]
        if first["id"] == "larger_gpu":
            return
    assert "flag" in first, f"{log.name}: lever #1 {first['id']} {first['change']} has no flag"
    assert any(_speaks(first["flag"], w) for w in _words(engine)), f"{log.name}: {first['flag']!r} is not {engine}'s"
    (setting,) = first["change"]
    assert setting in engine_words(engine), f"{log.name}: change {first['change']} is not a {engine} setting"


@pytest.mark.parametrize("engine,log", ENGINE_FIXTURES)
def test_no_lever_speaks_another_engines_language(engine: str, log: Path) -> None:
    card, _, d = diagnose_log(log, no_card=True, no_device=True)
    foreign = set().union(*(_words(e) for e in ("vllm",) + OTHER_ENGINES if e != engine)) - _words(engine)
    for lv in card["levers"]:
        flag = lv.get("flag", "")
        assert not any(_speaks(flag, w) for w in foreign), f"{log.name}: {flag!r} is another engine's flag"
        for setting in lv["change"]:
            assert setting in engine_words(engine) or lv["id"] in ("free_other_processes", "larger_gpu"), \
                f"{log.name}: {lv['id']} changes {setting}, not a {engine} setting"


def test_an_sglang_log_never_gets_a_vllm_flag() -> None:
    # the flags only vLLM has (--quantization and --kv-cache-dtype are SGLang's too)
    vllm_flags = {w for w in _words("vllm") if w.startswith("--")} - _words("sglang")
    assert "--gpu-memory-utilization" in vllm_flags and "--enforce-eager" in vllm_flags
    seen = []
    for log in _fixtures_of("sglang"):
        card, _, _ = diagnose_log(log, no_card=True, no_device=True)
        for lv in card["levers"]:
            seen.append(lv.get("flag", ""))
            assert not any(_speaks(lv.get("flag", ""), f) for f in vllm_flags), f"{log.name}: {lv}"
    assert "--mem-fraction-static 0.93" in seen          # kv_capacity: the pool needs a larger static fraction
    assert "--disable-cuda-graph" in seen                 # cuda_graph_oom's third lever


def test_sglang_kv_capacity_raises_the_static_fraction_to_the_printed_minimum() -> None:
    """SGLang's newer wording prints the minimum viable fraction; the lever never proposes less."""
    c = Ctx("kv_capacity", {"gpu_memory_utilization": 0.88, "minimum_mem_fraction_static": 0.912}, {}, {}, [])
    levers = propose_engine("sglang", c)
    assert levers[0]["change"] == {"mem_fraction_static": 0.93} and levers[0]["flag"] == "--mem-fraction-static 0.93"
    c = Ctx("kv_capacity", {"gpu_memory_utilization": 0.85, "minimum_mem_fraction_static": 0.9335}, {}, {}, [])
    assert propose_engine("sglang", c)[0]["change"] == {"mem_fraction_static": 0.94}


def test_the_same_class_moves_the_fraction_the_way_the_failure_needs() -> None:
    up = propose_engine("sglang", Ctx("kv_capacity", {"gpu_memory_utilization": 0.7}, {}, {}, []))[0]
    down = propose_engine("sglang", Ctx("cuda_graph_oom", {"gpu_memory_utilization": 0.7}, {}, {}, []))[0]
    assert up["change"] == {"mem_fraction_static": 0.75} and down["change"] == {"mem_fraction_static": 0.65}


def test_each_engine_answers_in_its_own_words() -> None:
    def first(engine: str, klass: str, numbers: dict) -> str:
        return levermod.propose(klass, numbers, {}, {}, [], engine=engine)[0]["flag"]

    assert first("llamacpp", "kv_allocation_oom", {"max_model_len": 131072}) == "-c 65536"
    assert first("ollama", "weights_load_oom", {"layers_total": 28, "layers_on_gpu": 21}) == "PARAMETER num_gpu 15"
    assert first("tgi", "profiling_oom", {"max_batch_prefill_tokens": 10000}) == "--max-batch-prefill-tokens 5000"
    assert first("tensorrt_llm", "kv_allocation_oom", {}) == "--kv_cache_free_gpu_memory_fraction 0.8"
    assert first("lmdeploy", "weights_load_oom", {}) == "--tp 2"
    # vLLM keeps its own generators; its levers now carry vLLM's flag too
    assert first("vllm", "cuda_graph_oom", {}) == "--enforce-eager"


def test_a_lever_whose_value_cannot_be_computed_is_left_out() -> None:
    """No current value in the log and no engine default: no guessed value."""
    spec = {"setting": "max_seq_len", "current": ["max_model_len"], "scale": 0.5}
    c = Ctx("runtime_oom", {}, {}, {}, [])
    assert value_of(spec, c) == (None, None)
    assert value_of(spec, Ctx("runtime_oom", {"max_model_len": 8192}, {}, {}, []))[0] == 4096
    # a change that changes nothing is no lever
    assert value_of({"setting": "s", "current": ["x"], "scale": 0.5, "min": 64}, Ctx("k", {"x": 64}, {}, {}, [])) == (None, None)


def test_an_explicit_value_the_lever_changes_is_flagged() -> None:
    wl = {"engine_args": {"max_batch_prefill_tokens": 8192}, "explicit_args": ["max_batch_prefill_tokens"]}
    levers = levermod.propose("profiling_oom", {}, wl, {}, [], engine="tgi")
    (lv,) = [x for x in levers if x["id"] == "max_num_batched_tokens"]
    assert lv["change"] == {"max_batch_prefill_tokens": 4096} and lv["explicit_override"] is True
    assert levers[0]["explicit_override"] is False          # a lever on a default ranks before it


def test_a_lever_already_tried_is_not_proposed_again() -> None:
    n = {"max_batch_prefill_tokens": 10000}
    first = levermod.propose("profiling_oom", n, {}, {}, [], engine="tgi")[0]
    again = levermod.propose("profiling_oom", n, {}, {}, [{"lever": first["id"], "change": first["change"]}], engine="tgi")
    assert again and again[0]["change"] != first["change"]


@pytest.mark.parametrize("engine", OTHER_ENGINES)
def test_lever_table_is_consistent_data(engine: str) -> None:
    table = engine_table(engine)
    assert table.get("engine") == engine
    settings = engine_words(engine)
    for lid, spec in (table.get("levers") or {}).items():
        assert lid in contract.LEVERS, f"{engine}: {lid} is not a contract lever"
        assert spec["setting"] in settings, f"{engine}: lever {lid} moves unknown setting {spec['setting']}"
    for klass, entries in table["by_class"].items():
        assert klass in contract.CLASSES, f"{engine}: {klass}"
        for entry in entries:
            lid = entry if isinstance(entry, str) else entry["id"]
            assert lid in contract.LEVERS and (lid in table["levers"] or lid in ("larger_gpu", "free_other_processes"))
            _, spec = _spec(table, entry)          # raises on a key the lever engine does not know
            assert set(spec) <= SPEC_KEYS
    # every setting's words render
    for setting in settings:
        assert flag_for(engine, setting, 1) is not None
    assert (ENGINES_DIR / engine / "levers.yaml").is_file()


# ----------------------------------------------------------------------------- engines that embed another
def test_a_log_of_an_engine_that_embeds_llamacpp_is_that_engines() -> None:
    """Ollama's runner prints llama.cpp's own lines: more of them than Ollama's must not make it llama.cpp's."""
    assert RULESET.engines["ollama"].embeds == ["llamacpp"]
    counts = {e: 0 for e in RULESET.engines}
    counts.update(llamacpp=8, ollama=2)
    assert choose_engine(RULESET, counts, {}, None) == "ollama"
    counts.update(ollama=0)
    assert choose_engine(RULESET, counts, {}, None) == "llamacpp"
    d = diagnose_file(FG / "oe-029.log", RULESET)
    assert d.engine == "ollama" and d.rule == "llamacpp.compute.alloc_failed"
    assert RULESET.family("ollama") == {"ollama", "llamacpp"} and RULESET.family("llamacpp") == {"llamacpp"}


def test_every_rule_of_the_other_engines_has_a_positive_and_a_negative_case() -> None:
    for r in RULESET.rules:
        if r.engine not in OTHER_ENGINES or r.role == "frame":
            continue
        expects = {t.get("expect", "match") for t in r.tests}
        assert "match" in expects, r.id
        if r.role != "info":
            assert "no_match" in expects, f"{r.id}: no negative case"


def test_tensorrt_errors_not_memory_unless_out_of_memory() -> None:
    # tensorrt_llm.other.trt_error: TensorRT's "[TRT] [E] <where>: Error Code N: <category> (<detail>)" is a
    # non-memory root, except when the text is an out-of-memory report (category OutOfMemory, oe-046; or the CUDA
    # runtime's "out of memory" in the detail). The last two lines are constructed to check the exclusion only.
    from oomdoctor.diagnose.parse import parse_line
    rule = next(r for r in RULESET.rules if r.id == "tensorrt_llm.other.trt_error")
    oom = next(r for r in RULESET.rules if r.id == "tensorrt_llm.build.trt_out_of_memory")
    kopt = ("[11/15/2023-08:41:37] [TRT] [E] IBuilder::buildSerializedNetwork: Error Code 4: Internal Error (kOPT "
            "values for profile 0 violate shape constraints ...)")
    real_oom = ("[11/15/2023-08:41:37] [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: "
                "OutOfMemory (no further information)")
    assert rule.match(parse_line(1, kopt)) and not oom.match(parse_line(1, kopt))
    assert oom.match(parse_line(1, real_oom)) and not rule.match(parse_line(1, real_oom))
    assert not rule.match(parse_line(1, "[11/15/2023-08:41:37] [TRT] [E] 1: [x.cpp::f::20] Error Code 1: X (out of memory)"))
    # a warning or an info line is no failure, nor another tool's "Error Code" text
    assert not rule.match(parse_line(1, "[11/15/2023-08:41:37] [TRT] [W] y: Error Code 4: Internal Error (z)"))
    assert not rule.match(parse_line(1, "2015-01-03 07:00:00,1,Error Code 1: Low Voltage"))


def test_a_model_file_in_ollama_s_store_does_not_make_a_llama_cpp_tool_ollama(tmp_path: Path) -> None:
    # llama-bench (a Vulkan build) given an Ollama blob: the shape of a committed real stderr (held-out set 18). Ollama's
    # own Go sources and runners still name it (field guide oe-026..031)
    p = tmp_path / "bench.stderr"
    p.write_text("ggml_vulkan: Found 1 Vulkan devices:\n"
                 "ggml_vulkan: 0 = Radeon 8060S Graphics (RADV STRIX_HALO) (radv) | uma: 1 | fp16: 1 | bf16: 0\n"
                 "main: error: failed to load model '/usr/share/ollama/.ollama/models/blobs/sha256-f5ee307a29'\n",
                 encoding="utf-8")
    assert diagnose_file(p, load_rules(rules_dir())).engine == "llamacpp"
    for case in ("oe-026", "oe-028", "oe-031"):
        assert diagnose_file(LOGS / "field-guide" / f"{case}.log", load_rules(rules_dir())).engine == "ollama"
