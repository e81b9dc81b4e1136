"""ONE serving-profiles reader: the gate, the vLLM plugin and the ladder accept and refuse the same files."""
from __future__ import annotations

import json

import pytest
import yaml

from oomdoctor import profiles
from oomdoctor.analysis.ladder import read_profile
from oomdoctor.errors import BadInput
from oomdoctor.gate.configs import parse_profiles as gate_parse_profiles

GiB = 1 << 30


def _write(tmp_path, doc: dict, name: str = "p.yaml"):
    p = tmp_path / name
    p.write_text(json.dumps(doc) if name.endswith(".json") else yaml.safe_dump(doc))
    return p


def test_serving_profiles_key_is_read_by_all_three(tmp_path) -> None:
    """A model's config.json with `serving_profiles`: the gate read it, the plugin refused it."""
    doc = {"architectures": ["X"], "serving_profiles": {"small": {"window": 8192, "declared_free_bytes": "8GiB",
                                                                   "settings": {"max_num_seqs": 8}}}}
    p = _write(tmp_path, doc, "config.json")
    assert set(gate_parse_profiles(p.read_text(), "config.json")) == {"small"}
    ps = profiles.load_profiles(p)
    assert [x.name for x in ps.profiles] == ["small"] and ps.profiles[0].settings == {"max_num_seqs": 8}
    assert read_profile(p, "small")["bytes"] == 8 * GiB


def test_unknown_field_is_refused_by_all_three(tmp_path) -> None:
    """An engine option beside `settings`: the gate refused it, the plugin and the ladder silently ignored it."""
    doc = {"profiles": {"a": {"window": 8192, "max_num_seqs": 8, "requires_free_bytes": "8GiB"}}}
    p = _write(tmp_path, doc)
    msg = "profiles.a.max_num_seqs: unknown field (engine options go under `settings`)"
    with pytest.raises(BadInput, match=r"unknown field \(engine options go under `settings`\)") as e1:
        gate_parse_profiles(p.read_text(), "p.yaml")
    with pytest.raises(BadInput) as e2:
        profiles.load_profiles(p)
    with pytest.raises(BadInput) as e3:
        read_profile(p, "a")
    for e in (e1, e2, e3):
        assert msg in str(e.value), str(e.value)


def test_the_ladder_reads_only_the_profiles_format(tmp_path) -> None:
    """The ladder had a format of its own (a bare `{NAME: {...}}`), which the plugin never read."""
    p = _write(tmp_path, {"a": {"requires_free_bytes": "8GiB"}})
    with pytest.raises(BadInput, match="no 'profiles'"):
        read_profile(p, "a")
