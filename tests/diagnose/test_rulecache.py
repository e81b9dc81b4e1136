"""The cache of the bundled rule files' parsed YAML (diagnose/rulecache.py): a load from it gives the same
catalogue, key order included; a cache file that is not this user's own, not private, broken, foreign or stale
is not used (the YAML is parsed); an empty OOMDOCTOR_CACHE_DIR turns it off."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import oomdoctor
from oomdoctor.diagnose import rules as rules_mod
from oomdoctor.diagnose.rulecache import RuleDocs
from oomdoctor.paths import ENGINES_DIR


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("OOMDOCTOR_CACHE_DIR", str(d))
    return d


def _parses(monkeypatch) -> list[Path]:
    calls: list[Path] = []
    orig = rules_mod._parse
    monkeypatch.setattr(rules_mod, "_parse", lambda path, data: calls.append(path) or orig(path, data))
    return calls


def test_the_second_load_comes_from_the_cache_and_is_the_same(cache, monkeypatch):
    first = rules_mod.load_rules(ENGINES_DIR)
    files = list(cache.glob("rules-*.json"))
    assert len(files) == 1 and oct(files[0].stat().st_mode & 0o777) == "0o600"
    calls = _parses(monkeypatch)
    second = rules_mod.load_rules(ENGINES_DIR)
    assert calls == []                                   # nothing parsed
    assert repr(second.rules) == repr(first.rules)       # dataclass fields, dict key order included
    assert repr(second.engines) == repr(first.engines)


@pytest.mark.parametrize("spoil", ["group_writable", "folder_writable", "garbage", "foreign_files", "other_version",
                                   "symlink"])
def test_a_cache_file_that_cannot_be_trusted_is_not_used(cache, monkeypatch, spoil, tmp_path):
    rules_mod.load_rules(ENGINES_DIR)
    (f,) = cache.glob("rules-*.json")
    if spoil == "group_writable":
        f.chmod(0o620)
    elif spoil == "folder_writable":
        cache.chmod(0o777)
    elif spoil == "garbage":
        f.write_text('{"version": ')
    elif spoil == "foreign_files":
        f.write_text('{"version": "%s", "files": {"x.yaml": {"id": "planted"}}}' % oomdoctor.__version__)
    elif spoil == "other_version":
        f.write_text(f.read_text().replace('"version": "', '"version": "0.0.0-', 1))
    else:
        real = tmp_path / "elsewhere.json"
        real.write_bytes(f.read_bytes())
        f.unlink()
        os.symlink(real, f)
    calls = _parses(monkeypatch)
    rs = rules_mod.load_rules(ENGINES_DIR)
    assert len(calls) > 40 and not any(r.id == "planted" for r in rs.rules)


def test_a_changed_rule_file_is_parsed_again(tmp_path, monkeypatch):
    monkeypatch.setenv("OOMDOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "rules"
    (root / "demo").mkdir(parents=True)
    f = root / "demo" / "engine.yaml"
    f.write_text("engine: demo\n")
    parsed: list[bytes] = []

    def docs() -> RuleDocs:
        return RuleDocs(root, [f], Path.read_bytes, lambda p, b: parsed.append(b) or {"engine": b.decode()}, True)

    d = docs()
    assert d.load(f) == {"engine": "engine: demo\n"}
    d.save()
    assert docs().load(f) == {"engine": "engine: demo\n"} and len(parsed) == 1        # from the cache
    f.write_text("engine: demo2\n")
    assert docs().load(f) == {"engine": "engine: demo2\n"} and len(parsed) == 2       # a new file: parsed


def test_an_empty_cache_dir_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("OOMDOCTOR_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    rules_mod.load_rules(ENGINES_DIR)
    calls = _parses(monkeypatch)
    rules_mod.load_rules(ENGINES_DIR)
    assert len(calls) > 40 and not list(tmp_path.rglob("rules-*.json"))


def test_data_json_cannot_carry_is_not_cached(tmp_path, monkeypatch):
    import datetime

    monkeypatch.setenv("OOMDOCTOR_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "rules"
    root.mkdir()
    f = root / "a.yaml"
    f.write_text("x")
    for doc in ({"when": datetime.date(2026, 12, 1)}, {1: "an int key"}, {"t": (1, 2)}):
        d = RuleDocs(root, [f], Path.read_bytes, lambda p, b, doc=doc: doc, True)
        d.load(f)
        d.save()
        assert not list((tmp_path / "cache").glob("rules-*.json")), doc


def test_no_home_directory_means_no_cache(tmp_path, monkeypatch):
    from oomdoctor.diagnose.rulecache import cache_dir

    monkeypatch.delenv("OOMDOCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")          # ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "oomdoctor"

    def no_home():
        raise RuntimeError("Could not determine home directory.")
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert cache_dir() is None
    assert len(rules_mod.load_rules(ENGINES_DIR).rules) > 100
