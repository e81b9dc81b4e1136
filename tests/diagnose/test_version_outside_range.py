"""A log of an engine version outside the range the rules cover is diagnosed with the nearest covered version's
rules and says so (``version_caveat``, confidence at most medium); refusal (exit 2) stays for bad input only. And an
engine's ``detect_lines`` are scan anchors: a paste of only such lines is told apart."""
from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules
from oomdoctor.diagnose.rulespec import anchors_of, nearest_covered, version_in
from oomdoctor.errors import BadInput

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
RULES = default_rules()


@pytest.mark.parametrize("version,spec,near", [("0.7.3", ">=0.8,<0.34", "0.8"), ("0.40.1", ">=0.8,<0.34", "0.33.9999"),
                                                ("0.4", ">=0.5,<0.6", "0.5"), ("0.6.1", ">=0.5,<0.6", "0.5.9999"),
                                                ("0.25.1", ">=0.8,<0.34", "0.25.1")])
def test_nearest_covered_version(version, spec, near):
    assert nearest_covered(version, spec) == near
    assert version_in(near, spec)


def test_a_clean_log_of_an_older_release_is_diagnosed_with_a_caveat():
    d = diagnose_file(LOGS / "vllm-0.7.3-formatstrings" / "clean_start_uncovered.log", RULES)
    assert (d.klass, d.engine, d.engine_version) == ("unknown", "vllm", "0.7.3")
    assert "0.7.3" in d.version_caveat and "nearest covered version (0.8)" in d.version_caveat
    assert d.classification()["version_caveat"] == d.version_caveat
    assert d.version_caveat in d.notes


def test_a_failure_of_an_older_release_is_classified_with_a_lower_confidence():
    d = diagnose_file(LOGS / "vllm-0.7.3-formatstrings" / "v0_preemption_uncovered.log", RULES)
    assert d.klass == "kv_preemption" and d.version_caveat
    assert d.confidence == "medium"          # "high" from a serving signal, lowered: the rules are for 0.8 on


def test_a_covered_version_has_no_caveat_and_a_version_that_does_not_parse_is_refused():
    assert not diagnose_file(LOGS / "vllm-0.8.5-formatstrings" / "v0_preemption.log", RULES).version_caveat
    with pytest.raises(BadInput, match="is not a vLLM version"):
        diagnose_file(LOGS / "vllm-0.7.3-formatstrings" / "clean_start_uncovered.log", RULES, engine_version="next")


def test_detect_lines_are_detection_strings_and_scan_anchors():
    anchors = anchors_of(RULES.rules, RULES.engines.values())
    for spec in RULES.engines.values():
        for s in spec.detect_lines:
            assert s in spec.detect and s.encode() in anchors, (spec.engine, s)
    assert RULES.engines["llamacpp"].detect_lines
