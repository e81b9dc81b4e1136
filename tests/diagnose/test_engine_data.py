"""Engines are plug-ins of the diagnose stage: what it knows about an engine comes from that engine's
``engines/<engine>/rules/`` data, nothing in oomdoctor/diagnose/ names an engine."""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

from oomdoctor.diagnose.classify import diagnose_lines
from oomdoctor.diagnose.read import SourceInfo
from oomdoctor.diagnose.rules import load_rules
from oomdoctor.paths import ENGINES_DIR

ROOT = Path(__file__).resolve().parents[2]
DIAGNOSE = ROOT / "oomdoctor" / "diagnose"

TOY_ENGINE = """engine: toy
name: Toy
covers: ">=1.0"
detect: ["toy-engine serving"]
version_patterns: []
preemption_counters: ["toy:preempted_requests_total"]
"""


def _rules_with_toy(tmp_path: Path) -> Path:
    root = tmp_path / "engines"
    shutil.copytree(ENGINES_DIR / "vllm" / "rules", root / "vllm")
    (root / "toy").mkdir()
    (root / "toy" / "engine.yaml").write_text(TOY_ENGINE)
    return root


def test_a_new_engines_preemption_counter_comes_from_its_engine_yaml(tmp_path: Path) -> None:
    ruleset = load_rules(_rules_with_toy(tmp_path))
    lines = [(1, "toy-engine serving on :8000"), (2, "toy-engine serving requests")]
    d = diagnose_lines(lines, ruleset, SourceInfo("toy.log"),
                       metrics_text="# TYPE toy:preempted_requests_total counter\ntoy:preempted_requests_total 7\n")
    assert d.engine == "toy"
    assert d.klass == "kv_preemption"
    assert d.runtime["preemptions"] == 7
    assert d.runtime.get("preemptions_source") == "metrics"


def test_vllms_counter_is_vllm_data_and_the_other_engines_do_not_read_it(tmp_path: Path) -> None:
    ruleset = load_rules(_rules_with_toy(tmp_path))
    assert ruleset.engines["vllm"].preemption_counters[0] == "vllm:num_preemptions_total"
    lines = [(1, "toy-engine serving on :8000")]
    d = diagnose_lines(lines, ruleset, SourceInfo("toy.log"), metrics_text="vllm:num_preemptions_total 5\n")
    assert d.engine == "toy" and d.klass == "unknown"


def test_nothing_in_diagnose_names_an_engine() -> None:
    engines = sorted(p.name for p in ENGINES_DIR.iterdir() if (p / "rules" / "engine.yaml").is_file())
    assert engines, "no engine folders with rules found"
    for path in sorted(DIAGNOSE.glob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                for e in engines:
                    assert f"{e}:" not in node.value and node.value != e, \
                        f"{path.relative_to(ROOT)}:{node.lineno} names engine {e!r}: put it in engines/{e}/rules/"
