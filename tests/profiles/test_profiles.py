"""Serving-profile selection on the edges incident 1 hit (docs/incidents.md), with its real figures.

Figures from the incident: ladder thresholds long_393k fails at 25,371,803,648 / starts at 25,571,033,088 free
(declared 24,053,735,802), long_262k fails at 23,461,298,176 / starts at 23,970,906,112 (declared 22,378,037,226);
25,229,197,312 free at selection; a clamp 0.95 -> 0.723; long_393k pinned kv_cache_memory_bytes=5.2e9; long_262k had
no utilization of its own; a failing (33,568,063,488 free) and a working (34,188,820,480 free) start got the same
budget with a 0.95 utilization under a 0.98 safety factor.

The card's NVML total is not in the incident: TOTAL = 34,190,917,632 B (31.84 GiB, a 32 GB card) is an assumption,
chosen because it reproduces the incident's clamp exactly: floor(25,229,197,312 x 0.98 / TOTAL, 3) = 0.723.
"""
from __future__ import annotations

import json
import math

import pytest
import yaml

from oomdoctor import profiles as prof
from oomdoctor.errors import BadInput

TOTAL = 34_190_917_632
DEFAULTS = {"max_model_len": 1_010_000, "gpu_memory_utilization": 0.92, "kv_cache_memory_bytes": None,
            "max_num_seqs": None}


def incident_doc(**over) -> dict:
    doc = {
        "schema": prof.SCHEMA_ID,
        "model": "a 1,010,000-token checkpoint with model-owned serving profiles",
        "profiles": {
            "raw_1010k": {"window": 1_010_000, "settings": {"gpu_memory_utilization": 0.95},
                          "declared_free_bytes": 30_000_000_000},                   # never measured
            "long_393k": {"window": 393_216,
                          "settings": {"gpu_memory_utilization": 0.95, "kv_cache_memory_bytes": "5.2e9"},
                          "requires_free_bytes": 25_571_033_088,
                          "declared_free_bytes": 24_053_735_802,
                          "measured": {"receipt": "receipts/long_393k-ladder.yaml", "pass_free_bytes": 25_571_033_088,
                                       "fail_free_bytes": 25_371_803_648, "engine_version": "0.25.1",
                                       "device": "rtx5090 (ballast-emulated rtx4090)"}},
            "long_262k": {"window": 262_144,                                          # no utilization of its own
                          "requires_free_bytes": 23_970_906_112,
                          "declared_free_bytes": 22_378_037_226,
                          "measured": {"receipt": "receipts/long_262k-ladder.yaml", "pass_free_bytes": 23_970_906_112,
                                       "fail_free_bytes": 23_461_298_176, "engine_version": "0.25.1"}},
        },
    }
    doc.update(over)
    return doc


@pytest.fixture
def ps() -> prof.ProfileSet:
    return prof.parse_profiles(incident_doc())


def sel(ps, free, explicit=None, forced=None, **kw):
    return prof.select_profile(ps, free, TOTAL, explicit or {}, forced, defaults=DEFAULTS, engine_version="0.25.1", **kw)


# ----------------------------------------------------------------------------- parsing
def test_parse_statuses_and_sizes(ps):
    by = {p.name: p for p in ps.profiles}
    assert by["long_393k"].status == "measured" and by["long_393k"].requires_free_bytes == 25_571_033_088
    assert by["long_393k"].settings["kv_cache_memory_bytes"] == 5_200_000_000       # "5.2e9" (YAML reads it as text)
    assert by["long_393k"].measured["precision_bytes"] == 25_571_033_088 - 25_371_803_648
    assert by["long_393k"].measured["verified"] is False                          # the receipt file is not here
    assert by["raw_1010k"].status == "unmeasured" and by["raw_1010k"].requires_free_bytes is None
    assert ps.safety_factor == 0.98


def test_a_requirement_without_receipt_is_only_declared():
    doc = incident_doc()
    doc["profiles"]["long_262k"].pop("measured")
    p = {x.name: x for x in prof.parse_profiles(doc).profiles}["long_262k"]
    assert p.status == "unmeasured" and "not a measurement" in p.status_reason
    assert p.requires_free_bytes is None and p.declared_free_bytes == 22_378_037_226
    doc["profiles"]["long_262k"]["measured"] = {"pass_free_bytes": 23_970_906_112}       # figures but no receipt
    p = {x.name: x for x in prof.parse_profiles(doc).profiles}["long_262k"]
    assert p.status == "unmeasured" and "names no receipt" in p.status_reason


def test_declared_below_the_ladder_is_invalid():
    doc = incident_doc()
    doc["profiles"]["long_393k"]["requires_free_bytes"] = 24_053_735_802           # the declared figure
    p = {x.name: x for x in prof.parse_profiles(doc).profiles}["long_393k"]
    assert p.status == "invalid" and "below the ladder's pass point" in p.status_reason
    s = sel(prof.parse_profiles(doc), 30_000_000_000)
    assert s.profile.name == "long_262k"                                           # never the invalid one


def test_receipt_file_is_read_and_verified(tmp_path):
    """A card written by `oomdoctor ladder` carries the pass/fail points at the top of its `ladder` section."""
    (tmp_path / "receipts").mkdir()
    card = {"schema": "oomdoctor.incident/v1", "engine": {"name": "vllm", "version": "0.25.1"},
            "ladder": {"status": "done", "pass_free_bytes": 23_970_906_112, "fail_free_bytes": 23_461_298_176,
                       "precision_bytes": 536_870_912, "engine": "vllm", "engine_version": "0.25.1",
                       "device": "nvidia-geforce-rtx-5090", "config_fingerprint": "sha256:" + "0" * 64,
                       "result": {"status": "measured", "threshold_bytes": 23_970_906_112}}}
    (tmp_path / "receipts" / "long_262k-ladder.yaml").write_text(yaml.safe_dump(card))
    f = tmp_path / "profiles.yaml"
    f.write_text(yaml.safe_dump(incident_doc()))
    by = {p.name: p for p in prof.load_profiles(f).profiles}
    m = by["long_262k"].measured
    assert by["long_262k"].status == "measured" and m["verified"] is True and m["source"] == "receipt file"
    assert m["precision_bytes"] == 536_870_912 and m["device"] == "nvidia-geforce-rtx-5090"
    # the receipt says the threshold is higher than the profile claims: invalid
    card["ladder"]["pass_free_bytes"] = 24_500_000_000
    (tmp_path / "receipts" / "long_262k-ladder.yaml").write_text(yaml.safe_dump(card))
    assert {p.name: p for p in prof.load_profiles(f).profiles}["long_262k"].status == "invalid"
    # a receipt without a ladder result is no measurement
    (tmp_path / "receipts" / "long_262k-ladder.yaml").write_text(yaml.safe_dump({"schema": "x"}))
    p = {p.name: p for p in prof.load_profiles(f).profiles}["long_262k"]
    assert p.status == "invalid" and "no `ladder` section" in p.status_reason


def test_json_and_list_forms(tmp_path):
    doc = incident_doc()
    doc["profiles"] = [dict(v, name=k) for k, v in doc["profiles"].items()]
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    assert [p.name for p in prof.load_profiles(f).profiles] == ["raw_1010k", "long_393k", "long_262k"]


@pytest.mark.parametrize("bad, msg", [
    ({"schema": "other/v9", "profiles": {"a": {}}}, "schema"),
    ({"profiles": {}}, "no profiles"),
    ({"profiles": {"a": {"settings": {"gpu_memory_utilization": 1.5}}}}, "not in (0, 1]"),
    ({"profiles": {"a": {"window": 10, "settings": {"max_model_len": 20}}}}, "differs from window"),
    ({"profiles": [{"window": 1}]}, "has no name"),
    ({"profiles": {"a": {"settings": {"max-num-seqs": 4}}}}, "snake_case"),
])
def test_bad_files(bad, msg):
    with pytest.raises(BadInput, match=msg.replace("(", r"\(").replace("]", r"\]")):
        prof.parse_profiles(bad)


# ----------------------------------------------------------------------------- free memory between thresholds
@pytest.mark.parametrize("free, want", [
    (25_371_803_648, "long_262k"),     # long_393k's measured fail point: not long_393k, the next one that fits
    (25_571_033_088, "long_393k"),     # its pass point: starts
    (25_229_197_312, "long_262k"),     # the incident's free memory: the plugin chose long_393k on a declared figure
    (23_970_906_112, "long_262k"),     # long_262k's pass point
    (23_461_298_176, None),            # long_262k's fail point: nothing measured fits
])
def test_widest_measured_profile_that_fits(ps, free, want):
    s = sel(ps, free)
    assert (s.profile.name if s.profile else None) == want
    if want is None:
        assert s.changes == {} and "no profile fits" in s.reasons[0]
        assert "long_262k needs 23,970,906,112 B" in s.reasons[0] and "raw_1010k" in s.reasons[0]
    else:
        assert s.changes["max_model_len"] == {"long_393k": 393_216, "long_262k": 262_144}[want]
        assert s.requirement_kind == "measured"


def test_the_log_line_per_substitution(ps):
    s = sel(ps, 25_571_033_088)
    lines = s.log_lines()
    assert lines[0] == ("oomdoctor: max_model_len default 1010000 -> 393216 (profile long_393k, measured "
                        "25,571,033,088 B free needed, 25,571,033,088 B free)")
    assert any(ln.startswith("oomdoctor: kv_cache_memory_bytes default None -> 5200000000 (profile long_393k") for ln in lines)


def test_the_widest_wins_even_when_a_narrower_one_needs_more():
    doc = incident_doc()
    doc["profiles"]["tiny"] = {"window": 8192, "requires_free_bytes": 25_000_000_000,
                               "measured": {"receipt": "r.yaml", "pass_free_bytes": 25_000_000_000}}
    assert sel(prof.parse_profiles(doc), 25_100_000_000).profile.name == "long_262k"


# ----------------------------------------------------------------------------- clamp, pinned arena, saturation
def test_clamp_of_an_unpinned_profile_without_its_own_utilization(ps):
    """long_262k had no gpu_memory_utilization: vLLM's default 0.92 is the base, and it is clamped (in the incident
    the clamp returned nothing and 0.92 failed vLLM's start-up check)."""
    free = 23_970_906_112
    s = sel(ps, free)
    want = math.floor(free * 0.98 / TOTAL * 1000) / 1000
    assert want == 0.687 and s.changes["gpu_memory_utilization"] == want
    assert s.clamp["applied"] is True and s.clamp["base"] == 0.92 and "default" in s.clamp["base_source"]
    assert math.ceil(TOTAL * want) <= free                                       # vLLM's check passes
    assert any("has no gpu_memory_utilization" in w for w in s.warnings)
    line = [ln for ln in s.log_lines() if "gpu_memory_utilization" in ln][0]
    assert "clamped to free x 0.98 / total = 23,970,906,112 x 0.98 / 34,190,917,632 = 0.687" in line


def test_pinned_arena_makes_the_clamp_dead_and_says_so(ps):
    """The incident: long_393k, 25,229,197,312 free, 0.95 -> 0.723 'clamped' while kv_cache_memory_bytes pinned the
    arena — vLLM reserved the 4.84 GiB anyway. Forced here (its requirement does not fit), as the plugin did."""
    s = sel(ps, 25_229_197_312, forced="long_393k")
    assert s.profile.name == "long_393k"
    assert s.changes["gpu_memory_utilization"] == 0.723                          # the incident's figure
    assert s.clamp["applied"] is False and s.clamp["check_only"] is True
    assert s.clamp["pinned_kv_cache_memory_bytes"] == 5_200_000_000
    line = [ln for ln in s.log_lines() if "gpu_memory_utilization" in ln][0]
    assert "NOT a clamp" in line and "pinned at 5,200,000,000 B" in line
    assert any("no clamp for profile long_393k" in w and "would size nothing" in w for w in s.warnings)
    assert any("needs 25,571,033,088 B free" in w and "expect the start to fail" in w for w in s.warnings)
    assert not any("saturates" in w for w in s.warnings)                        # no budget to saturate when pinned


def test_an_explicit_pinned_arena_counts_as_pinned(ps):
    s = sel(ps, 24_000_000_000, explicit={"kv_cache_memory_bytes": 4_000_000_000})
    assert s.profile.name == "long_262k" and s.clamp["check_only"] is True
    assert "kv_cache_memory_bytes" not in s.changes


def test_budget_saturates_when_utilization_is_below_the_safety_factor():
    failing, working = 33_568_063_488, 34_188_820_480
    assert prof.budget(TOTAL, failing, 0.95) == prof.budget(TOTAL, working, 0.95) == math.ceil(TOTAL * 0.95)
    lo, hi = prof.saturation_range(TOTAL, 0.95)
    assert lo <= failing < working <= hi
    assert prof.saturation_range(TOTAL, 0.98) is None and prof.budget(TOTAL, failing, 0.98) < prof.budget(TOTAL, working, 0.98)
    doc = incident_doc()
    doc["profiles"]["big"] = {"window": 600_000, "settings": {"gpu_memory_utilization": 0.95},
                              "requires_free_bytes": 33_700_000_000,
                              "measured": {"receipt": "r.yaml", "pass_free_bytes": 33_700_000_000,
                                           "fail_free_bytes": failing}}
    s = sel(prof.parse_profiles(doc), working)
    assert s.profile.name == "big" and s.changes["gpu_memory_utilization"] == 0.95   # within the cap: not clamped
    [w] = [w for w in s.warnings if "saturates" in w]
    assert f"it no longer tracks free memory between {lo:,} and {hi:,} B" in w
    assert "the requirement 33,700,000,000 B lies in that range" in w
    assert s.clamp["saturates"]["budget_bytes"] == math.ceil(TOTAL * 0.95)


# ----------------------------------------------------------------------------- explicit, forced, NVML, unmeasured
def test_explicit_max_model_len_admits_only_that_window(ps):
    s = sel(ps, 30_000_000_000, explicit={"max_model_len": 262_144})
    assert s.profile.name == "long_262k" and "max_model_len" not in s.changes
    assert s.kept_explicit == {"max_model_len": 262_144}
    s = sel(ps, 30_000_000_000, explicit={"max_model_len": 100_000})
    assert s.profile is None and s.changes == {}
    assert "only profiles with window 100000 are eligible" in s.reasons[0]


def test_explicit_values_are_never_overridden(ps):
    s = sel(ps, 30_000_000_000, explicit={"gpu_memory_utilization": 0.9})
    # long_393k sets 0.95: contradicts the explicit 0.9 → not eligible; long_262k sets none → eligible
    assert s.profile.name == "long_262k" and "gpu_memory_utilization" not in s.changes
    c = {c["name"]: c for c in s.candidates}
    assert "contradicts the profile's gpu_memory_utilization=0.95" in c["long_393k"]["why_not"]
    assert any("refuse the start" in w for w in s.warnings)                    # 0.9 x total > 30e9 free


def test_forced_profile(ps):
    s = sel(ps, 40_000_000_000, forced="long_262k")
    assert s.profile.name == "long_262k" and s.forced == "long_262k"
    assert "forced by OOMDOCTOR_PROFILE" in s.log_lines()[0]
    s = sel(ps, 40_000_000_000, forced="raw_1010k")                             # unmeasured: allowed when forced
    assert s.profile.name == "raw_1010k" and any("unmeasured" in w for w in s.warnings)
    s = sel(ps, 40_000_000_000, forced="nope")
    assert s.profile is None and "no such profile" in s.reasons[0]
    s = sel(ps, 40_000_000_000, forced="long_393k", explicit={"max_model_len": 262_144})
    assert s.changes.get("max_model_len") is None and any("explicit max_model_len" in w for w in s.warnings)


def test_nvml_unavailable_selects_nothing(ps):
    s = prof.select_profile(ps, None, None, {}, None, defaults=DEFAULTS)
    assert s.profile is None and s.changes == {} and "NVML unavailable" in s.reasons[0]
    s = prof.select_profile(ps, None, None, {}, "long_262k", defaults=DEFAULTS)  # forced still applies, unclamped
    assert s.changes == {"max_model_len": 262_144} and s.clamp["note"] == "free memory unknown: not clamped"


def test_unmeasured_is_never_selected_unless_allowed(ps):
    s = sel(ps, 200_000_000_000)
    assert s.profile.name == "long_393k"                                        # raw_1010k is wider but unmeasured
    assert {c["name"]: c for c in s.candidates}["raw_1010k"]["why_not"].startswith("unmeasured")
    s = sel(ps, 200_000_000_000, allow_unmeasured=True)
    assert s.profile.name == "raw_1010k" and s.requirement_kind == "declared"
    assert "UNMEASURED, declared 30,000,000,000 B free needed" in s.log_lines()[0]
    assert any("ALLOW_UNMEASURED" in w for w in s.warnings)


def test_a_measurement_on_another_engine_version_is_not_one(ps):
    s = prof.select_profile(ps, 30_000_000_000, TOTAL, {}, None, defaults=DEFAULTS, engine_version="0.33.0")
    assert s.profile is None
    c = {c["name"]: c for c in s.candidates}
    assert "measured on vLLM 0.25.1, this is vLLM 0.33.0" in c["long_393k"]["why_not"]


def test_selection_is_pure(ps):
    before = [p.to_dict() for p in ps.profiles]
    a = sel(ps, 25_571_033_088).to_dict()
    b = sel(ps, 25_571_033_088).to_dict()
    assert a == b and [p.to_dict() for p in ps.profiles] == before
    json.dumps(a)                                                               # plain data


def test_cli_dry_run(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(incident_doc()))
    rc = prof.main([str(f), "--free", "25571033088", "--total", str(TOTAL)])
    out = capsys.readouterr().out
    assert rc == 0 and "ELIGIBLE" in out and "max_model_len default None -> 393216" in out
    rc = prof.main([str(f), "--free", "23461298176", "--total", str(TOTAL), "--json"])
    assert rc == 1 and json.loads(capsys.readouterr().out)["selected"] is None


def test_a_ladder_of_another_config_does_not_measure_a_profile(tmp_path) -> None:
    """The receipt must have measured THIS profile's settings (here: the real H200 ladder of a 3e9 arena)."""
    import shutil as _sh
    from pathlib import Path as _P

    from oomdoctor.profiles import load_profiles

    root = _P(__file__).resolve().parents[2]
    (tmp_path / "incidents" / "ladder").mkdir(parents=True)
    _sh.copy(root / "incidents" / "ladder" / "ladder1.yaml", tmp_path / "incidents" / "ladder" / "ladder1.yaml")
    good = (root / "examples" / "profiles" / "gpu-kit-llama-h200.yaml").read_text()
    (tmp_path / "a" / "b").mkdir(parents=True)
    p = tmp_path / "a" / "b" / "p.yaml"
    p.write_text(good)
    ok = {x.name: x for x in load_profiles(p).profiles}["short_32k"]
    assert ok.status == "measured" and ok.requires_free_bytes == 8322678784
    p.write_text(good.replace("kv_cache_memory_bytes: 3000000000", "kv_cache_memory_bytes: 4000000000"))
    bad = {x.name: x for x in load_profiles(p).profiles}["short_32k"]
    assert bad.status == "invalid" and "another config" in bad.status_reason and bad.requires_free_bytes is None
