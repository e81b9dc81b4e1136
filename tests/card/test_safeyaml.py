"""One safe YAML loader for every file oomdoctor reads (cards, receipts, project files, profiles, rules): an alias
bomb, deep nesting, a huge integer or a huge file end in exit 2 with one line — fast — never in an internal
error, minutes of work or gigabytes; and every committed card loads exactly as PyYAML's safe loader reads it."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, invoke
from oomdoctor import safeyaml
from oomdoctor.errors import BadInput, RuleError

CARD = ROOT / "incidents" / "h200-A_fail.yaml"
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(9))
BOMBS = {
    "laughs": (LAUGHS, "aliases are expanded"),
    "deep": ("schema: x\nid: " + "[" * 3000 + "]" * 3000 + "\n", "malformed YAML"),
    "deep_block": ("".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v: 1\n", "nested deeper"),
    "bigint": (CARD.read_text().replace("max_model_len: 4000000", "max_model_len: " + "9" * 4000, 1), "integer"),
    "hugeint": ("n: " + "9" * 5000 + "\n", "integer"),
    "list8mb": ("- 1\n" * 2_000_000, "larger than 2,097,152 bytes"),
    "list1mb": ("- 1\n" * 250_000, "at most 100,000 values"),
}


def one_line_error(r, contains: str) -> None:
    assert r.rc == 2 and len(r.err.splitlines()) == 1, (r.rc, r.err[-400:])
    assert r.err.startswith("oomdoctor: error:") and contains in r.err and "Traceback" not in r.err, r.err


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_bomb_card_is_one_line_exit_2_and_fast(tmp_path, name):
    text, why = BOMBS[name]
    p = tmp_path / "card.yaml"
    p.write_text(text)
    t0 = time.perf_counter()
    one_line_error(invoke("retest", p, "--dry-run"), why)
    assert time.perf_counter() - t0 < 30


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_bomb_project_file_is_bad_input(tmp_path, name):
    from oomdoctor.gate.project import load_project

    text, why = BOMBS[name]
    p = tmp_path / ".oomdoctor.yaml"
    p.write_text(text)
    with pytest.raises(BadInput, match=why if name != "bigint" else "integer|configs"):
        load_project(p, tmp_path)


def test_a_deep_or_huge_json_profiles_file_is_bad_input(tmp_path):
    from oomdoctor.profiles.files import read_doc

    for text, why in (("[" * 100_000 + "]" * 100_000, "nested"), ('{"n": ' + "9" * 1000 + "}", "integer"),
                      ("[" * 70 + "]" * 70, "nested deeper")):
        p = tmp_path / "profiles.json"
        p.write_text(text)
        with pytest.raises(BadInput, match=why):
            read_doc(p)


def test_a_rules_file_with_an_alias_bomb_is_refused(tmp_path):
    root = tmp_path / "rules"
    shutil.copytree(ROOT / "oomdoctor" / "engines" / "vllm" / "rules", root / "vllm")
    (root / "vllm" / "bomb.yaml").write_text(LAUGHS)
    from oomdoctor.diagnose.rules import load_rules

    with pytest.raises(RuleError, match="bomb.yaml.*aliases are expanded"):
        load_rules(root)


@pytest.mark.parametrize("card", sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("incidents/**/*.yaml")))
def test_every_committed_card_loads_as_pyyaml_reads_it(card):
    text = (ROOT / card).read_text()
    assert safeyaml.load(text) == yaml.safe_load(text)


def test_shared_and_self_references_are_weighed_once_each():
    assert safeyaml.load("a: &x [1, 2]\nb: *x\nc: *x\n") == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}
    d = safeyaml.load("a: &a [*a, 1]\n")
    assert d["a"][1] == 1 and d["a"][0] is d["a"]
    assert safeyaml.check(json.loads('{"n": 150754820096}')) == {"n": 150754820096}
