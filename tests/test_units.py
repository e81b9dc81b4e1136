"""The one size parser (oomdoctor.units.parse_size): every form the stages feed it."""
from __future__ import annotations

import pytest

from oomdoctor.errors import BadInput
from oomdoctor.units import NAMED_CARDS, parse_size


@pytest.mark.parametrize("text, want", [
    (24, 24), (24.0, 24), ("150754820096", 150_754_820_096), ("5.2e9", 5_200_000_000),
    ("24GiB", 24 << 30), ("24 GiB", 24 << 30), ("24 gib", 24 << 30), ("24 GB", 24 * 10**9),
    ("272.00 MiB", 272 << 20), ("1,024 MiB", 1 << 30), ("1.5G", 3 << 29), ("-5", -5),
    ("H200", NAMED_CARDS["h200"][1]), ("rtx 4090", 24 << 30), ("A100-80", 80 << 30),
])
def test_parse_size_forms(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text, unit", [("inf", "B"), ("1e400", "B"), ("-inf", "B"), ("inf", "GiB"), ("1e400", "MiB")])
def test_parse_size_refuses_infinity_as_bad_input(text, unit):
    # before: int(float('inf')) escaped as an OverflowError (a traceback instead of one line)
    with pytest.raises(BadInput, match="not finite"):
        parse_size(text, unit)


@pytest.mark.parametrize("text", ["nan", "24Gi", "lots", True, ""])
def test_parse_size_refuses_non_sizes(text):
    with pytest.raises(BadInput, match="not a memory size"):
        parse_size(text)


def test_parse_size_names_the_field():
    with pytest.raises(BadInput, match=r"^--free: not a memory size: 'lots'"):
        parse_size("lots", what="--free")
