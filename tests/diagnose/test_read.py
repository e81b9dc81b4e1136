"""Stage 1, read: streaming lines of plain and gzip logs, the 1 MiB line cap, the hash of the file
as stored, and what is refused before any line is read (empty, binary, broken gzip)."""
from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from oomdoctor.diagnose import read
from oomdoctor.errors import BadInput
from oomdoctor.diagnose.read import MAX_LINE_BYTES, PROBE_BYTES, SourceInfo, file_sha256, iter_lines, looks_binary, probe

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-0.25.1-h200"
M = MAX_LINE_BYTES


def lines_of(path, info=None):
    return list(iter_lines(path, info))


def put(tmp_path: Path, data: bytes, name="x.log", gz=False) -> Path:
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


@pytest.mark.parametrize("gz", [False, True])
def test_numbering_and_line_endings(tmp_path, gz):
    p = put(tmp_path, b"one\r\ntwo\rstill two\n\nfour\r\r\nfive", gz=gz)
    info = SourceInfo(str(p))
    assert lines_of(p, info) == [(1, b"one"), (2, b"two\rstill two"), (3, b""), (4, b"four"), (5, b"five")]
    assert info.lines == 5 and info.cut_lines == [] and info.compressed is gz


@pytest.mark.parametrize("name", sorted(p.name for p in FIX.glob("*.log")))
def test_fixture_lines_plain_equal_gzip(tmp_path, name):
    data = (FIX / name).read_bytes()
    plain = lines_of(FIX / name)
    assert plain == [(i, ln.rstrip(b"\r")) for i, ln in enumerate(data.split(b"\n")[:-1], 1)]
    assert lines_of(put(tmp_path, data, gz=True)) == plain


@pytest.mark.parametrize("gz", [False, True])
def test_long_lines_are_cut_and_numbering_continues(tmp_path, gz):
    data = (b"head\n" + b"a" * (M - 1) + b"\n" + b"b" * M + b"\n" + b"c" * (3 * M + 5) + b"\r\n"
            + b"after\n" + b"d" * (M + 1))
    p = put(tmp_path, data, gz=gz)
    info = SourceInfo(str(p))
    got = lines_of(p, info)
    assert [n for n, _ in got] == [1, 2, 3, 4, 5, 6]
    assert [len(ln) for _, ln in got] == [4, M - 1, M, M, 5, M]
    assert got[3][1] == b"c" * M and got[4][1] == b"after"
    assert info.cut_lines == [3, 4, 6]          # a line of MAX_LINE_BYTES or more (before its newline) is cut
    assert info.lines == 6


@pytest.mark.parametrize("gz", [False, True])
def test_sha256_and_size_are_of_the_file_as_stored(tmp_path, gz):
    p = put(tmp_path, (FIX / "A_fail.log").read_bytes(), gz=gz)
    info = SourceInfo(str(p))
    lines_of(p, info)
    stored = p.read_bytes()
    assert info.sha256 == hashlib.sha256(stored).hexdigest() == file_sha256(p)
    assert info.size_bytes == len(stored)


def test_early_stop_still_hashes_the_whole_file_when_asked(tmp_path):
    p = put(tmp_path, b"x\n" * 500_000)
    info = SourceInfo(str(p))
    for n, _ in iter_lines(p, info):
        if n == 3:
            break
    assert info.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    assert info.size_bytes == p.stat().st_size


def test_early_stop_without_info_does_not_read_the_rest(tmp_path, monkeypatch):
    """workload.read_header reads a few lines of a maybe-gigabyte log: no hashing of the rest."""
    called = []
    monkeypatch.setattr(read.HashingReader, "finish", lambda self: called.append(1))
    p = put(tmp_path, b"x\n" * 1000)
    for n, _ in iter_lines(p):
        if n == 3:
            break
    assert called == []
    info = SourceInfo(str(p))
    for n, _ in iter_lines(p, info):
        if n == 3:
            break
    assert called == [1]


# ----------------------------------------------------------------------------- refused inputs
@pytest.mark.parametrize("data,why", [
    (b"", "empty"),
    (b"  \n\t\n\r\n   ", "empty"),
    (b"INFO ok\n\x00\x01\x02binary", "binary"),
    (bytes(range(32)) * 100, "binary"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00", "binary"),
])
@pytest.mark.parametrize("gz", [False, True])
def test_probe_refuses(tmp_path, data, why, gz):
    p = put(tmp_path, data, gz=gz)
    with pytest.raises(BadInput, match=why):
        probe(p)
    with pytest.raises(BadInput, match=why):
        lines_of(p)


def test_probe_missing_and_directory(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        probe(tmp_path / "nope.log")
    with pytest.raises(BadInput, match="is a directory"):
        probe(tmp_path)


def test_truncated_gzip(tmp_path):
    small = gzip.compress(b"INFO line\n" * 10)
    p = put(tmp_path, small[:-10], "small.gz")
    with pytest.raises(BadInput, match="truncated or corrupt gzip"):
        lines_of(p)
    big = gzip.compress((FIX / "F1b_fail.log").read_bytes() * 300)
    p = put(tmp_path, big[: len(big) * 2 // 3], "big.gz")
    with pytest.raises(BadInput, match="truncated or corrupt gzip file after line"):
        lines_of(p)


def test_leading_blank_lines_longer_than_the_probe_are_not_empty(tmp_path):
    p = put(tmp_path, b"\n" * (PROBE_BYTES + 10) + b"INFO the log starts late\n")
    assert probe(p)[0] is False
    got = lines_of(p)
    assert got[-1] == (PROBE_BYTES + 11, b"INFO the log starts late")


def test_text_with_colours_tabs_and_utf8_is_not_binary():
    assert not looks_binary("\x1b[32mINFO\x1b[0m\tok ▄█ é\r\n".encode() * 100)
    assert not looks_binary(b"\xff\xfe latin-1 \xe9t\xe9\n" * 100)
    assert looks_binary(b"\x00")
    assert not looks_binary(b"")


def test_random_bytes_without_nul_are_binary():
    import random
    rng = random.Random(1)
    data = bytes(rng.randrange(1, 256) for _ in range(4096))
    assert looks_binary(data)
