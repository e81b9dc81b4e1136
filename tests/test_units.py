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


def test_sizes_and_human_ints_are_parsed_in_linear_time() -> None:
    """`"1" + 20,000 blanks + "x"` took 4.7 s in parse_size (a trailing \\s* after the optional unit made every split
    of the blanks between the two \\s* be tried) and 4 s in parse_human_int; a gate config (16 MiB) or a card can
    hold such a value (requires_free_bytes, kv_cache_memory_bytes, max_model_len)."""
    import time

    from oomdoctor.levers.plan import parse_human_int

    for parse in (parse_size, lambda s: parse_human_int(s, "max_model_len")):
        t0 = time.perf_counter()
        with pytest.raises(BadInput):
            parse("1" + " " * 200_000 + "x")
        assert time.perf_counter() - t0 < 1.0
    assert [parse_size(s) for s in (" 24 GiB ", "1.5G", "8 bytes", "2 g ")] == [24 << 30, 1536 << 20, 8, 2 << 30]
    got = [parse_human_int(s, "x") for s in (" 32k ", "32K", "1.5M", "1,024", " 7 ")]
    assert got == [32000, 32768, 1572864, 1024, 7]
