"""The anchor prefilter: the grep fast path and the pure-Python path return exactly the same
(line number, line) pairs and the same SourceInfo (sha256, size, line count, cut lines), on every
fixture and on nasty inputs; and match_lines' anchor lookup equals testing every anchor on every line.
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from oomdoctor.diagnose import match as matching
from oomdoctor.errors import BadInput
from oomdoctor.diagnose.read import CHUNK, MAX_LINE_BYTES, PROBE_BYTES, SourceInfo, looks_binary
from oomdoctor.diagnose.rules import anchors_of, default_rules
from oomdoctor.diagnose.signals import RuntimeTracker
from oomdoctor.diagnose.scan import scan, scan_grep, scan_python

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-0.25.1-h200"
GREP = shutil.which("grep")
M = MAX_LINE_BYTES
needs_grep = pytest.mark.skipif(GREP is None, reason="no grep on PATH")

RULES = default_rules()
ANCHORS = sorted(anchors_of(RULES.rules, RULES.engines.values()))
A1 = b"CUDA out of memory. Tried to allocate "
A2 = b"GPU KV cache usage: "
assert A1 in ANCHORS and A2 in ANCHORS


def both(path: Path, anchors=ANCHORS):
    """(python pairs, python info), (grep pairs, grep info)."""
    ip, ig = SourceInfo(str(path)), SourceInfo(str(path))
    p = list(scan_python(path, anchors, ip))
    g = list(scan_grep(path, anchors, ig, GREP))
    return (p, dataclasses.asdict(ip)), (g, dataclasses.asdict(ig))


def assert_same(path: Path, anchors=ANCHORS) -> list[tuple[int, bytes]]:
    (p, ip), (g, ig) = both(path, anchors)
    assert g == p
    assert ig == ip
    return p


def reference_lines(data: bytes) -> tuple[list[tuple[int, bytes]], int, list[int]]:
    """What every scanner must see, computed the obvious way: split on \\n, cut at MAX_LINE_BYTES,
    strip the line ending, keep lines whose kept part holds an anchor."""
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    out, cut = [], []
    for i, ln in enumerate(parts, 1):
        if len(ln) >= M:
            cut.append(i)
        kept = ln[:M].rstrip(b"\r\n")
        if any(a in kept for a in ANCHORS):
            out.append((i, kept))
    return out, len(parts), cut


# ----------------------------------------------------------------------------- real logs
@needs_grep
@pytest.mark.parametrize("name", sorted(p.name for p in FIX.glob("*.log")))
def test_fixture_same_pairs_plain_and_gzip(tmp_path, name):
    log = FIX / name
    pairs = assert_same(log)
    assert pairs, "every fixture has anchored lines"
    ref, nlines, cut = reference_lines(log.read_bytes())
    assert pairs == ref
    gz = tmp_path / (name + ".gz")
    gz.write_bytes(gzip.compress(log.read_bytes()))
    assert assert_same(gz) == pairs


@needs_grep
def test_info_is_the_file_as_stored(tmp_path):
    log = FIX / "F2_fail.log"
    (_, ip), (_, ig) = both(log)
    data = log.read_bytes()
    assert ig["sha256"] == hashlib.sha256(data).hexdigest()
    assert ig["size_bytes"] == len(data)
    assert ig["lines"] == data.count(b"\n") == 115      # all lines, not the last matching one
    assert ig["compressed"] is False and ig["cut_lines"] == []


# ----------------------------------------------------------------------------- nasty inputs
def write(tmp_path: Path, name: str, data: bytes, gz: bool = False) -> Path:
    p = tmp_path / (name + (".gz" if gz else ""))
    p.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    return p


HEAD = b"INFO 11-29 15:05:31 [model.py:1776] Using max model len 32768\n"   # text first: not "binary"
NASTY = {
    "crlf": HEAD + b"(EngineCore pid=1) " + A1 + b"20.00 MiB.\r\nplain\r\n" + A2 + b"99.0%\r\n",
    "lone_cr": HEAD + b"progress\r" + A2 + b"1%\rmore\r" + A1 + b"\n",
    "many_cr_at_end": HEAD + A1 + b"\r\r\r\n" + A2 + b"\r\n\r\n",
    "no_trailing_newline": HEAD + b"x\n" + A2 + b"50%",
    "cr_only_last": HEAD + A2 + b"50%\r",
    "blank_lines": HEAD + b"\n\n\n" + A1 + b"\n\n",
    "invalid_utf8_and_nul_late": HEAD * 2000 + b"\xff\xfe\x80 " + A1 + b"\x00\x01 tail\n\xc3(\n",
    "exact_limit_minus_one": HEAD + A1 + b"a" * (M - 1 - len(A1)) + b"\n" + A2 + b"\n",
    "exact_limit": HEAD + A1 + b"a" * (M - len(A1)) + b"\n" + A2 + b"\n",
    "limit_plus_one": HEAD + A1 + b"a" * (M + 1 - len(A1)) + b"\n" + A2 + b"\n",
    "anchor_beyond_cut": HEAD + b"b" * (M + 10) + A1 + b"\n" + A2 + b"\n",
    "anchor_straddles_cut": HEAD + b"c" * (M - len(HEAD) - 5) + A1 + b"\n",
    "anchor_ends_at_cut": HEAD + b"d" * (M - len(A1)) + A1 + b"xyz\n",
    "cr_at_the_cut": HEAD + A2 + b"e" * (M - len(A2) - 3) + b"\r\r\r\r\rzz\n" + A1 + b"\n",
    "long_last_line_no_newline": HEAD + A2 + b"f" * (2 * M),
    "several_long_lines": HEAD + (A1 + b"g" * (3 * M) + b"\n" + b"h" * M + b"\n" + A2 + b"\n") * 2,
    "long_line_across_chunks": HEAD + b"i" * (CHUNK - 100) + b"\n" + b"j" * (M + 7) + A1 + b"\n" + A2 * 3 + b"\n",
    "newline_at_chunk_edge": HEAD + b"k" * (CHUNK - len(HEAD) - 1) + b"\n" + A1 + b"l" * M + b"\n",
    "long_line_between_short_ones_in_one_chunk": HEAD + (b"m\n" * 1000) + b"n" * (M + M // 2) + b"\n" + (A2 + b"\n") * 3,
}


@needs_grep
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("name", sorted(NASTY))
def test_nasty_inputs_same_pairs_and_info(tmp_path, name, gz):
    data = NASTY[name]
    path = write(tmp_path, name, data, gz)
    pairs = assert_same(path)
    ref, nlines, cut = reference_lines(data)
    assert pairs == ref
    info = SourceInfo(str(path))
    list(scan_grep(path, ANCHORS, info, GREP))
    assert info.lines == nlines
    assert info.cut_lines == cut
    assert all(len(line) <= M for _, line in pairs)


@needs_grep
def test_multi_member_and_zero_padded_gzip(tmp_path):
    a, b = FIX.joinpath("A_fail.log").read_bytes(), FIX.joinpath("B_fail.log").read_bytes()
    p = tmp_path / "multi.log.gz"
    p.write_bytes(gzip.compress(a) + gzip.compress(b) + b"\x00" * 512)
    pairs = assert_same(p)
    assert pairs == reference_lines(a + b)[0]


@needs_grep
def test_truncated_gzip_is_bad_input_on_both_paths(tmp_path):
    data = gzip.compress(FIX.joinpath("F1b_fail.log").read_bytes() * 200)
    p = tmp_path / "cut.log.gz"
    p.write_bytes(data[: len(data) // 2])
    for fn in (lambda: list(scan_python(p, ANCHORS, SourceInfo(str(p)))),
               lambda: list(scan_grep(p, ANCHORS, SourceInfo(str(p)), GREP))):
        with pytest.raises(BadInput, match="truncated or corrupt gzip"):
            fn()


@needs_grep
def test_trailing_garbage_after_gzip_is_bad_input_on_both_paths(tmp_path):
    p = tmp_path / "junk.log.gz"
    p.write_bytes(gzip.compress(FIX.joinpath("A_fail.log").read_bytes()) + b"this is not gzip")
    for fn in (lambda: list(scan_python(p, ANCHORS, SourceInfo(str(p)))),
               lambda: list(scan_grep(p, ANCHORS, SourceInfo(str(p)), GREP))):
        with pytest.raises(BadInput):
            fn()


@needs_grep
def test_no_anchors_finds_nothing_but_still_counts(tmp_path):
    log = FIX / "A_fail.log"
    (p, ip), (g, ig) = both(log, anchors=[])
    assert p == g == []
    assert ig == ip and ig["lines"] == 110


@needs_grep
def test_early_stop_cleans_up(tmp_path):
    p = write(tmp_path, "big", (HEAD + A2 + b"1%\n") * 50_000, gz=True)
    it = scan_grep(p, ANCHORS, SourceInfo(str(p)), GREP)
    assert [next(it)[0] for _ in range(3)] == [1, 2, 3]
    it.close()                      # grep killed, the feeding thread stops, nothing hangs


def test_scan_engine_choice(tmp_path, monkeypatch):
    log = FIX / "A_fail.log"
    py = list(scan(log, ANCHORS, engine="python"))
    assert list(scan(log, ANCHORS, engine="auto")) == py
    monkeypatch.setenv("OOMDOCTOR_NO_GREP", "1")
    assert list(scan(log, ANCHORS, engine="auto")) == py


# ----------------------------------------------------------------------------- generated inputs
line_piece = st.one_of(
    st.sampled_from([A1, A2, b"(EngineCore", b"Error: ", b"NCCL error", b"[core.py:", b"LLM engine (v"]),
    st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\x00", b" ")),
    st.text(alphabet="abcxyz 0123456789:()[]%.-\r\u00e9\u2588", max_size=30).map(lambda s: s.encode()),
)
gen_line = st.lists(line_piece, max_size=4).map(b"".join)
gen_end = st.sampled_from([b"\n", b"\r\n", b"\r\r\n", b"\n"])


@needs_grep
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.tuples(gen_line, gen_end), min_size=1, max_size=60), last_newline=st.booleans(),
       gz=st.booleans(), long_at=st.none() | st.integers(min_value=0, max_value=59))
def test_generated_logs_same_pairs(tmp_path_factory, lines, last_newline, gz, long_at):
    body = [ln + end for ln, end in lines]
    if long_at is not None and long_at < len(body):   # one over-long line, sometimes holding an anchor past the cut
        body[long_at] = body[long_at][:-1] + b"q" * (M + 3) + A1 + b"\n"
    data = HEAD + b"".join(body)
    if not last_newline:
        data = data.rstrip(b"\n")
    # mostly random bytes are refused as binary by both paths alike (read.probe); compare the text logs
    assume(not looks_binary(data[:PROBE_BYTES]))
    path = write(tmp_path_factory.mktemp("gen"), "gen.log", data, gz)
    (p, ip), (g, ig) = both(path)
    assert g == p
    assert ig == ip
    ref, nlines, cut = reference_lines(data)
    assert p == ref and ip["lines"] == nlines and ip["cut_lines"] == cut


# ----------------------------------------------------------------------------- match_lines
def _run(lines):
    """match_lines over ``lines`` → comparable (matches, detection counts, versions, runtime summary, hits)."""
    rt, hits = RuntimeTracker(), {}
    matches, counts, versions = matching.match_lines(list(lines), RULES.rules, list(RULES.engines.values()), rt, hits)
    rt.select(lambda engine, versions: True)
    return [(m.rule.id, m.n, m.line.msg, m.numbers, m.groups) for m in matches], counts, versions, rt.summary(), hits


ALL_LINES = [ln for p in sorted(FIX.glob("*.log")) for ln in p.read_bytes().split(b"\n")]


def test_match_lines_on_the_real_fixtures():
    lines = list(enumerate(ALL_LINES, 1))
    got = _run(lines)
    matches, counts, versions, summary, hits = got
    assert versions["vllm"][0] == "0.25.1" and counts["vllm"] > 100
    kv = [m for m in matches if m[0] == "vllm.kv_capacity.max_seq_len"]
    assert kv and kv[0][3]["max_model_len"] == 4000000 and kv[0][3]["kv_needed_bytes"] == 262143328911
    assert summary["stats_lines"] > 10 and hits["vllm.runtime.stats"]["count"] == summary["stats_lines"]
    # the same lines given as str (parse_line's other input type) give the same result
    assert _run([(n, b.decode("utf-8", "replace")) for n, b in lines]) == got


def _mutate(line: bytes, rnd: random.Random) -> bytes:
    out = bytearray()
    for c in line:
        if 48 <= c <= 57 and rnd.random() < 0.3:
            out += str(rnd.randint(0, 99999)).encode()      # other numbers, other widths
        else:
            out.append(c)
    return bytes(out)


@settings(max_examples=60, deadline=None)
@given(picks=st.lists(st.integers(min_value=0, max_value=len(ALL_LINES) - 1), min_size=1, max_size=80),
       seed=st.integers(min_value=0, max_value=2**16))
def test_colour_codes_do_not_change_what_matches(picks, seed):
    """ANSI escapes inserted anywhere (even inside an anchor) are removed by parse_line before matching."""
    rnd = random.Random(seed)
    plain, coloured = [], []
    for n, i in enumerate(picks, 1):
        b = _mutate(ALL_LINES[i], rnd)
        plain.append((n, b))
        if rnd.random() < 0.3 and len(b) > 4:
            k = rnd.randrange(len(b))
            b = b[:k] + b"\x1b[0m" + b[k:]
        coloured.append((n, b))
    assert _run(coloured) == _run(plain)


# ----------------------------------------------------------------------------- selectivity
def test_prefilter_does_not_select_access_lines():
    """The point of the anchors: a serving log's access lines never reach Python."""
    lines = (FIX / "Eserve_pass.log").read_bytes().split(b"\n")
    access = [ln for ln in lines if b' HTTP/1.1" ' in ln]
    assert len(access) > 60
    assert [ln for ln in access if any(a in ln for a in ANCHORS)] == []


def test_grep_s_memory_is_bounded_and_a_line_past_it_is_read_in_python(tmp_path, monkeypatch):
    # GNU grep holds a whole line in memory (a 300 MB line without a newline took 590 MB): grep's address space is
    # bounded, and past the bound ("memory exhausted") the Python scanner reads the log again
    import shutil

    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.diagnose.rules import default_rules
    from oomdoctor.errors import BadInput

    if shutil.which("grep") is None:
        pytest.skip("no grep on PATH")
    real = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-0.25.1-h200" / "A_fail.log"
    p = tmp_path / "one_long_line.log"
    p.write_bytes(b"x" * (64 << 20) + b"\n" + real.read_bytes())
    monkeypatch.setenv("OOMDOCTOR_GREP_MAX_BYTES", str(48 << 20))
    rules = default_rules()
    with pytest.raises(BadInput, match="memory exhausted"):
        diagnose_file(p, rules, scanner="grep")
    d = diagnose_file(p, rules)
    assert (d.klass, d.root.n if d.root else None) == ("kv_capacity", diagnose_file(real, rules).root.n + 1)
    assert d.source.lines == real.read_bytes().count(b"\n") + 1
