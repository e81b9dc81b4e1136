"""The rule catalogue as a test suite.

- every rule's own test cases (``tests:`` in its YAML), one pytest id per rule + fixture;
- every fixture log is diagnosed to the class written for it (table below, or its folder's ORIGIN.md);
- every fixture is detected as the engine its folder names, and no other engine's detection string
  occurs in it;
- every rule has at least one ``expect: match`` case, except the few listed (with the reason);
- malformed rule files fail ``load_rules`` with a RuleError that names the file.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomdoctor import contract
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.errors import RuleError
from oomdoctor.paths import rules_dir
from oomdoctor.diagnose.rules import load_rules
from oomdoctor.diagnose.ruletest import fixtures_root, run_rule_tests

RULES = rules_dir()
RULESET = load_rules(RULES)
LOGS = fixtures_root(RULES)


# ----------------------------------------------------------------------------- 1. the rules' own cases
def _case_ids() -> list[tuple[int, str]]:
    """The cases in the order run_rule_tests visits them (rule order, then case order)."""
    out: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    for rule in RULESET.rules:
        cases = rule.tests or [{"fixture": "-"}]
        for case in cases:
            base = f"{rule.id}[{case['fixture']}|{case.get('expect', 'match')}]"
            seen[base] = seen.get(base, 0) + 1
            out.append((len(out), base if seen[base] == 1 else f"{base}#{seen[base]}"))
    return out


CASES = _case_ids()


@pytest.fixture(scope="module")
def case_results():
    results = run_rule_tests(RULESET, RULES)
    assert len(results) == len(CASES), "run_rule_tests visited a different number of cases than the rules hold"
    return results


@pytest.mark.parametrize("index", [i for i, _ in CASES], ids=[name for _, name in CASES])
def test_rule_case(index, case_results):
    r = case_results[index]
    assert r.ok, f"{r.rule} [{r.fixture}]: " + "; ".join(r.problems)


# ----------------------------------------------------------------------------- 2. every fixture's class
# The class each fixture log must be diagnosed as. Folders not listed here are read from their
# ORIGIN.md table ("| file | ... | `class` |").
EXPECTED: dict[str, str] = {
    # real vLLM 0.25.1 logs (vllm-0.25.1-h200/ORIGIN.md)
    "vllm-0.25.1-h200/A_fail.log": "kv_capacity",
    "vllm-0.25.1-h200/A_pass.log": "unknown",
    "vllm-0.25.1-h200/B_fail.log": "free_memory_below_utilization",
    "vllm-0.25.1-h200/B_pass.log": "unknown",
    "vllm-0.25.1-h200/C2_fail.log": "weights_load_oom",
    "vllm-0.25.1-h200/D_fail.log": "kv_allocation_oom",
    "vllm-0.25.1-h200/D_pass.log": "unknown",
    "vllm-0.25.1-h200/E_pass.log": "kv_preemption",
    "vllm-0.25.1-h200/Eserve_pass.log": "kv_preemption",
    "vllm-0.25.1-h200/F1b_fail.log": "cuda_graph_oom",
    "vllm-0.25.1-h200/F1b_pass.log": "unknown",
    "vllm-0.25.1-h200/F2_fail.log": "unknown",          # the 400s are only in F2_client.txt
    # vLLM 0.33.0, rendered from its format strings
    "vllm-0.33.0-formatstrings/weights_load_oom.log": "weights_load_oom",
    "vllm-0.33.0-formatstrings/free_memory_below_utilization.log": "free_memory_below_utilization",
    "vllm-0.33.0-formatstrings/profiling_oom.log": "profiling_oom",
    "vllm-0.33.0-formatstrings/profiling_oom_v2runner.log": "profiling_oom",
    "vllm-0.33.0-formatstrings/kv_capacity.log": "kv_capacity",
    "vllm-0.33.0-formatstrings/kv_capacity_autofit.log": "kv_capacity",
    "vllm-0.33.0-formatstrings/kv_allocation_oom.log": "kv_allocation_oom",
    "vllm-0.33.0-formatstrings/autotuner_oom.log": "autotuner_oom",
    "vllm-0.33.0-formatstrings/cuda_graph_oom.log": "cuda_graph_oom",
    "vllm-0.33.0-formatstrings/sampler_warmup_oom.log": "sampler_warmup_oom",
    "vllm-0.33.0-formatstrings/runtime_oom.log": "runtime_oom",
    "vllm-0.33.0-formatstrings/kv_preemption.log": "kv_preemption",
    "vllm-0.33.0-formatstrings/admission_rejection.log": "admission_rejection",
    "vllm-0.33.0-formatstrings/config_invalid.log": "config_invalid",
    "vllm-0.33.0-formatstrings/config_invalid_batched_below_seqs.log": "config_invalid",
    "vllm-0.33.0-formatstrings/not_memory_profiling_inconsistent.log": "not_memory",
    "vllm-0.33.0-formatstrings/tp2_one_rank_oom.log": "cuda_graph_oom",
    "vllm-0.33.0-formatstrings/clean_start.log": "unknown",
    # vLLM 0.11.0
    "vllm-0.11.0-formatstrings/weights_load_oom.log": "weights_load_oom",
    "vllm-0.11.0-formatstrings/free_memory_below_utilization.log": "free_memory_below_utilization",
    "vllm-0.11.0-formatstrings/profiling_oom.log": "profiling_oom",
    "vllm-0.11.0-formatstrings/kv_capacity.log": "kv_capacity",
    "vllm-0.11.0-formatstrings/kv_allocation_oom.log": "kv_allocation_oom",
    "vllm-0.11.0-formatstrings/autotuner_oom.log": "autotuner_oom",
    "vllm-0.11.0-formatstrings/cuda_graph_oom.log": "cuda_graph_oom",
    "vllm-0.11.0-formatstrings/sampler_warmup_oom.log": "sampler_warmup_oom",
    "vllm-0.11.0-formatstrings/runtime_oom.log": "runtime_oom",
    "vllm-0.11.0-formatstrings/kv_preemption.log": "kv_preemption",
    "vllm-0.11.0-formatstrings/config_invalid.log": "config_invalid",
    "vllm-0.11.0-formatstrings/tp2_one_rank_oom.log": "profiling_oom",
    "vllm-0.11.0-formatstrings/clean_start.log": "unknown",
    # vLLM 0.8.5 (V0 and V1)
    "vllm-0.8.5-formatstrings/v0_kv_capacity.log": "kv_capacity",
    "vllm-0.8.5-formatstrings/v0_no_blocks.log": "kv_capacity",
    "vllm-0.8.5-formatstrings/v0_cuda_graph_oom.log": "cuda_graph_oom",
    "vllm-0.8.5-formatstrings/v0_preemption.log": "kv_preemption",
    "vllm-0.8.5-formatstrings/v0_prompt_too_long.log": "admission_rejection",
    "vllm-0.8.5-formatstrings/v1_kv_capacity.log": "kv_capacity",
    "vllm-0.8.5-formatstrings/v1_profiling_oom.log": "profiling_oom",
    "vllm-0.8.5-formatstrings/v1_weights_load_oom.log": "weights_load_oom",
    "vllm-0.8.5-formatstrings/v1_sampler_warmup_oom.log": "sampler_warmup_oom",
    "vllm-0.8.5-formatstrings/v1_runtime_oom.log": "runtime_oom",
    "vllm-0.8.5-formatstrings/config_invalid.log": "config_invalid",
    # SGLang 0.5.23
    "sglang-0.5.23-formatstrings/kv_capacity.log": "kv_capacity",
    "sglang-0.5.23-formatstrings/weights_load_oom.log": "weights_load_oom",
    "sglang-0.5.23-formatstrings/cuda_graph_oom.log": "cuda_graph_oom",
    "sglang-0.5.23-formatstrings/kv_preemption.log": "kv_preemption",
    "sglang-0.5.23-formatstrings/runtime_oom.log": "runtime_oom",
    "sglang-0.5.23-formatstrings/runtime_cuda_oom.log": "runtime_oom",
    "sglang-0.5.23-formatstrings/clean_start.log": "unknown",
    # llama.cpp @0c1e57098 (llama-cpp-python 0.3.36)
    "llamacpp-0c1e57098-formatstrings/weights_load_oom.log": "weights_load_oom",
    "llamacpp-0c1e57098-formatstrings/kv_allocation_oom.log": "kv_allocation_oom",
    "llamacpp-0c1e57098-formatstrings/compute_buffer_oom.log": "profiling_oom",
    "llamacpp-0c1e57098-formatstrings/runtime_oom.log": "runtime_oom",
    "llamacpp-0c1e57098-formatstrings/kv_preemption.log": "kv_preemption",
    "llamacpp-0c1e57098-formatstrings/admission_rejection.log": "admission_rejection",
    "llamacpp-0c1e57098-formatstrings/clean_start.log": "unknown",
    "llamacpp-0c1e57098-formatstrings/python_context_failed.log": "kv_allocation_oom",
}

# Known misdiagnoses: a failing expectation that documents a bug in oomdoctor/*.py (strict xfail: the
# test fails as soon as the bug is fixed, so this entry must then be removed).
KNOWN_WRONG: dict[str, str] = {}

ORIGIN_ROW = re.compile(r"^\|\s*([\w.\-]+\.log)\s*\|.*\|\s*`([a-z_]+)`\s*\|\s*$")


def _from_origin(folder: Path) -> dict[str, str]:
    origin = folder / "ORIGIN.md"
    if not origin.exists():
        return {}
    out = {}
    for line in origin.read_text(encoding="utf-8").splitlines():
        m = ORIGIN_ROW.match(line.strip())
        if m and m.group(2) in contract.CLASSES:
            out[f"{folder.name}/{m.group(1)}"] = m.group(2)
    return out


# field-guide/ has its own expected.yaml (class, phase and engine per case): tests/diagnose/test_field_guide.py
ALL_LOGS = sorted(p.relative_to(LOGS).as_posix() for p in LOGS.rglob("*.log") if p.parent.name != "field-guide")


def _expected(rel: str) -> str | None:
    if rel in EXPECTED:
        return EXPECTED[rel]
    return _from_origin(LOGS / rel.split("/")[0]).get(rel)


def test_every_fixture_log_has_an_expected_class():
    missing = [rel for rel in ALL_LOGS if _expected(rel) is None]
    assert not missing, "fixture logs without an expected class (add them to EXPECTED or to their ORIGIN.md table): " + ", ".join(missing)
    stale = sorted(set(EXPECTED) - set(ALL_LOGS))
    assert not stale, "EXPECTED names fixtures that do not exist: " + ", ".join(stale)


def test_origin_tables_agree_with_this_table():
    for folder in sorted({rel.split("/")[0] for rel in ALL_LOGS}):
        for rel, klass in _from_origin(LOGS / folder).items():
            if rel in EXPECTED:
                assert EXPECTED[rel] == klass, f"{rel}: ORIGIN.md says {klass}, this test says {EXPECTED[rel]}"


def _diagnosis_params():
    out = []
    for rel in ALL_LOGS:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[rel])] if rel in KNOWN_WRONG else []
        out.append(pytest.param(rel, id=rel, marks=marks))
    return out


@pytest.mark.parametrize("rel", _diagnosis_params())
def test_fixture_is_diagnosed_to_its_class(rel):
    expected = _expected(rel)
    if expected is None:
        pytest.fail(f"{rel}: no expected class")
    d = diagnose_file(LOGS / rel, RULESET)
    assert d.klass == expected, f"{rel}: diagnosed {d.klass} (rule {d.rule}, {d.phase_basis}), expected {expected}"
    assert d.is_memory_failure == (expected not in contract.NO_MEMORY_FAILURE)


# ----------------------------------------------------------------------------- 3. engine detection
ENGINE_OF_FOLDER = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "tgi": "tgi", "lmdeploy": "lmdeploy",
                    "ollama": "ollama", "tensorrt_llm": "tensorrt_llm"}


def _engine_of(rel: str) -> str | None:
    return ENGINE_OF_FOLDER.get(rel.split("/")[0].split("-")[0])


# the fixtures of a folder named after an engine (the field guide's engines are checked in test_field_guide.py; the
# folders of no engine — detect-, shell-, build-formatstrings, ... — in test_generic_rules.py / test_detect_shapes.py)
ENGINE_LOGS = [rel for rel in ALL_LOGS if _engine_of(rel) is not None]


def test_most_fixtures_are_in_a_folder_of_an_engine():
    assert len(ENGINE_LOGS) > 100


@pytest.mark.parametrize("rel", ENGINE_LOGS)
def test_fixture_is_detected_as_its_engine(rel):
    engine = _engine_of(rel)
    assert engine in RULESET.engines, f"no rules/{engine}/ for {rel}"
    d = diagnose_file(LOGS / rel, RULESET)
    assert d.engine == engine, f"{rel}: detected as {d.engine}, expected {engine}"
    # and no other engine's detection string occurs in it at all
    text = (LOGS / rel).read_text(encoding="utf-8", errors="replace")
    for other, spec in RULESET.engines.items():
        if other == engine or other in RULESET.engines[engine].embeds:   # Ollama's log carries llama.cpp's lines
            continue
        hits = [s for s in spec.detect if s in text]
        assert not hits, f"{rel} ({engine}) contains {other}'s detection strings {hits}"


def test_every_engine_has_fixtures():
    import yaml

    engines = {_engine_of(rel) for rel in ALL_LOGS}
    # an engine whose only fixtures are field-guide cases (Ollama, TensorRT-LLM, LMDeploy): tests/engines/
    engines |= {e["engine"] for e in yaml.safe_load((LOGS / "field-guide" / "expected.yaml").read_text(encoding="utf-8"))}
    for name in RULESET.engines:
        assert name in engines, f"rules/{name}/ has no fixture folder under fixtures/logs/"


# ----------------------------------------------------------------------------- 4. match cases
# Rules without an `expect: match` case, and why no fixture shows their message.
NO_MATCH_CASE = {
    "vllm.config.mamba_align_block_size": "0.25.1-only assertion for hybrid Mamba models; no captured or rendered hybrid-model log",
    "vllm.free_memory.external_weights": "0.33.0 external-weights path needs an out-of-process weight loader we did not model",
    "vllm.ledger.startup_plan_skipped": "the rendered startup-plan scenario applies its plan",
    "vllm.other.illegal_memory_access": "the text is torch's/CUDA's; the exception class torch prints for it changed across "
                                        "versions and was not checked, so no fixture renders it",
    "vllm.other.nccl": "NCCL's error text is NCCL's (not in the engine's sources); not rendered",
    "vllm.workload.v1_runner_fallback": "0.33.0's 'Model Runner V2 does not yet support %s' warning is in its format "
                                        "strings, but no rendered scenario uses a feature V2 lacks",
    "vllm.other.no_gpu": "torch's 'No CUDA GPUs are available' text was not checked against a torch source; not rendered",
}


def test_every_rule_has_a_match_case():
    lacking = sorted(r.id for r in RULESET.rules if not any(t.get("expect", "match") == "match" for t in r.tests))
    unexplained = [rid for rid in lacking if rid not in NO_MATCH_CASE]
    assert not unexplained, "rules without an 'expect: match' case: " + ", ".join(unexplained)
    stale = sorted(set(NO_MATCH_CASE) - set(lacking))
    assert not stale, "NO_MATCH_CASE lists rules that now have a match case (remove them): " + ", ".join(stale)


def test_every_rule_case_names_an_existing_fixture():
    for rule in RULESET.rules:
        for case in rule.tests:
            assert (LOGS / case["fixture"]).exists(), f"{rule.id}: fixture {case['fixture']} not found"


# ----------------------------------------------------------------------------- 5. malformed rules
ENGINE_YAML = textwrap.dedent("""\
    engine: demo
    name: Demo
    detect: ["demo engine starting"]
    """)

GOOD_RULE = textwrap.dedent("""\
    id: demo.ok
    engine: demo
    class: kv_capacity
    patterns:
      - regex: "KV cache too small: (?P<tokens>\\\\d+) tokens"
    numbers:
      kv_cache_tokens: {group: tokens, unit: tokens}
    levers: [max_model_len]
    """)

BAD_RULES = {
    "bad_yaml": ("id: demo.bad\nengine: demo\npatterns: [\n  - regex: 'x'\n", "malformed YAML"),
    "unknown_class": (GOOD_RULE.replace("demo.ok", "demo.bad").replace("class: kv_capacity", "class: kv_overflow"),
                      "not a contract class"),
    "unknown_lever": (GOOD_RULE.replace("demo.ok", "demo.bad").replace("levers: [max_model_len]", "levers: [buy_more_ram]"),
                      "not a contract lever"),
    "bad_regex": (GOOD_RULE.replace("demo.ok", "demo.bad").replace('"KV cache too small: (?P<tokens>\\\\d+) tokens"',
                                                                   '"KV cache too small: (?P<tokens>\\\\d+ tokens"'),
                  "invalid regex"),
    "no_anchor": ("id: demo.bad\nengine: demo\nclass: kv_capacity\npatterns:\n  - regex: '(?:ab|cd)\\d+'\n",
                  "no literal of 4+ characters"),
    "number_group_missing": (GOOD_RULE.replace("demo.ok", "demo.bad").replace("{group: tokens,", "{group: blocks,"),
                             "is not a named group"),
    "engine_folder_mismatch": (GOOD_RULE.replace("demo.ok", "demo.bad").replace("engine: demo", "engine: vllm"),
                               "does not match its folder"),
    "duplicate_id": (GOOD_RULE, "duplicate rule id 'demo.ok'"),
    "unknown_field": (GOOD_RULE.replace("demo.ok", "demo.bad") + "severity: high\n", "unknown field"),
    "milestone_without_reaches": ("id: demo.bad\nengine: demo\nrole: milestone\npatterns: ['demo engine ready']\n",
                                  "needs 'reaches"),
    "after_names_no_rule": (GOOD_RULE.replace("demo.ok", "demo.bad") + "after: [demo.nowhere]\n",
                            "'after' names no rule: demo.nowhere"),
    "after_on_a_milestone": ("id: demo.bad\nengine: demo\nrole: milestone\nreaches: weights_load\n"
                             "patterns: ['demo engine ready']\nafter: [demo.ok]\n", "'after' is a list of rule ids"),
}


def _write_rules(tmp_path: Path, bad_name: str | None, bad_text: str | None) -> Path:
    root = tmp_path / "rules"
    (root / "demo").mkdir(parents=True)
    (root / "demo" / "engine.yaml").write_text(ENGINE_YAML)
    (root / "demo" / "good.yaml").write_text(GOOD_RULE)
    if bad_name:
        (root / "demo" / f"{bad_name}.yaml").write_text(bad_text)
    return root


def test_well_formed_demo_rules_load(tmp_path):
    rs = load_rules(_write_rules(tmp_path, None, None))
    assert [r.id for r in rs.rules] == ["demo.ok"]
    assert rs.rules[0].patterns[0].anchor == "KV cache too small: "


@pytest.mark.parametrize("name", sorted(BAD_RULES))
def test_malformed_rule_file_is_refused_naming_the_file(tmp_path, name):
    text, reason = BAD_RULES[name]
    root = _write_rules(tmp_path, name, text)
    with pytest.raises(RuleError) as exc:
        load_rules(root)
    msg = str(exc.value)
    assert f"{name}.yaml" in msg, f"the error does not name the file: {msg}"
    assert reason in msg, f"expected {reason!r} in: {msg}"


def test_engine_yaml_in_the_wrong_folder_is_refused(tmp_path):
    root = _write_rules(tmp_path, None, None)
    (root / "demo" / "engine.yaml").write_text(ENGINE_YAML.replace("engine: demo", "engine: other"))
    with pytest.raises(RuleError, match="engine.yaml"):
        load_rules(root)


def test_bundled_catalogue_loads_the_same_eagerly_and_lazily(monkeypatch):
    """The bundled patterns are compiled when first used; loading them all eagerly (every regex compiled, every
    number's group read from the compiled regex, as for rules from outside the package) gives the same catalogue,
    and the group names read from the sources are the compiled ones."""
    from oomdoctor.diagnose import rules as rules_mod

    lazy = load_rules(RULES)
    assert not any("regex" in p.__dict__ for r in lazy.rules for p in r.patterns)     # nothing compiled yet
    monkeypatch.setattr(rules_mod, "EAGER", True)
    eager = load_rules(RULES)
    assert lazy.rules == eager.rules
    for r in lazy.rules:
        for p in r.patterns:
            assert rules_mod._group_names(p, r.path) == set(p.regex.groupindex), (r.id, p.source)


def test_rules_from_outside_the_package_are_compiled_at_load(tmp_path):
    root = _write_rules(tmp_path, "broken", GOOD_RULE.replace("demo.ok", "demo.broken").replace(
        "KV cache too small: ", "KV cache too small: (unclosed"))
    with pytest.raises(RuleError, match="invalid regex"):
        load_rules(root)
    rs = load_rules(_write_rules(tmp_path / "ok", None, None))
    assert all("regex" in p.__dict__ for r in rs.rules for p in r.patterns)


def _parser_items(pattern: str):
    from oomdoctor.diagnose.rulespec import sre_parse

    parsed = sre_parse.parse(pattern)
    if parsed.state.flags & re.IGNORECASE:
        return None
    return [chr(av) if op is sre_parse.LITERAL else None for op, av in parsed]


def test_quick_anchor_reader_is_the_regex_parser_on_the_catalogue():
    from oomdoctor.diagnose.rulespec import _top_items

    sources = [p.source for r in RULESET.rules for p in r.patterns]
    sources += [vp.pattern for e in RULESET.engines.values() for vp in e.version_patterns]
    read = [(s, _top_items(s)) for s in sources]
    assert sum(items is not None for _, items in read) > len(sources) // 2     # the quick reader is used
    for s, items in read:
        if items is not None:
            assert items == _parser_items(s), s


_PIECES = ["a", "b", "Q", " ", ":", "-", "#", "\\.", "\\(", "\\d", "\\s+", "\\n", "[ab]", "[.]", "[^x]", "(?:ab)",
           "(?:a|b)", "(ab)", "(?P<g>x)", "(?=a)", "(?>ab)", "(?i)", "(?#c)", ".", "^", "$", "*", "+", "?", "*?",
           "++", "{2}", "{1,3}", "|", ")", "(", "]", "}", "\\", "é"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=12))
def test_quick_anchor_reader_is_the_regex_parser(pieces):
    """On any valid pattern the quick reader reads, it reads what the regex parser gives (else it defers)."""
    from oomdoctor.diagnose.rulespec import _top_items

    pattern = "".join(pieces)
    try:
        expected = _parser_items(pattern)
    except re.error:
        return
    items = _top_items(pattern)
    if items is not None:
        assert items == expected
