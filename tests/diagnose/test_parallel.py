"""The parallel scan (diagnose/parallel.py) gives what the one-process path gives, on every fixture and on logs
built to cut its pieces badly: over-long lines, carriage returns, gzip, a line without its newline at the end."""
from __future__ import annotations

import gzip
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from oomdoctor.diagnose import parallel
from oomdoctor.diagnose.classify import _diagnose_path, diagnose_file, diagnose_matched
from oomdoctor.diagnose.read import MAX_LINE_BYTES, SourceInfo
from oomdoctor.diagnose.rules import anchors_of, default_rules
from oomdoctor.diagnose.scan import _grep_for
from oomdoctor.diagnose.signals import MAX_SAMPLES, RuntimeTracker, Sample, merge_samples
from oomdoctor.errors import BadInput

RULES = default_rules()
LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
ANCHORS = anchors_of(RULES.rules, RULES.engines.values())
GREP = _grep_for(list(ANCHORS), "auto", __file__)
needs_fork = pytest.mark.skipif(GREP is None or parallel.fcntl is None or not hasattr(os, "fork"),
                                reason="the parallel scan needs grep, fcntl and os.fork")


def summary(d) -> dict:
    """Everything a diagnosis says, as plain data."""
    return {"engine": (d.engine, d.engine_version, d.engine_version_line), "class": (d.klass, d.phase, d.rule),
            "root": (d.root.n, d.root.rule.id) if d.root else None, "evidence": d.evidence, "numbers": d.numbers,
            "numbers_source": d.numbers_source, "by_process": d.numbers_by_process, "reached": d.phase_reached,
            "levers": d.levers, "matches": [(m.n, m.rule.id, m.numbers, m.groups) for m in d.matches],
            "runtime": d.runtime, "notes": d.notes, "hits": d.hits, "confidence": d.confidence,
            "source": (d.source.sha256, d.source.size_bytes, d.source.lines, d.source.cut_lines, d.source.compressed)}


def in_parallel(path: Path, jobs: int, piece: int):
    info = SourceInfo(str(path))
    found = parallel.scan_and_match(path, ANCHORS, info, RULES.rules, list(RULES.engines.values()), GREP, jobs,
                                    None, piece)
    return diagnose_matched(found, RULES, info)


FIXTURES = sorted(p for p in LOGS.rglob("*") if p.is_file() and p.suffix not in (".md", ".py", ".yaml"))


@needs_fork
@pytest.mark.slow
def test_every_fixture_same_as_one_process():
    """Pieces of 4 KiB: most fixtures are cut into several, between the lines of one traceback."""
    diffs = []
    for p in FIXTURES:
        try:     # the scan of the file as it is (diagnose_file reads a paste with its renderer's additions undone)
            want = summary(_diagnose_path(p, RULES, None, None, None, "auto", None, SourceInfo(str(p))))
        except BadInput as e:
            want = {"refused": str(e)}
        try:
            got = summary(in_parallel(p, 3, 4096))
        except BadInput as e:
            got = {"refused": str(e)}
        if got != want:
            diffs.append((p.name, [k for k in want if want.get(k) != got.get(k)]))
    assert len(FIXTURES) > 200 and not diffs


STATS = (b"(APIServer pid=7) INFO 11-29 10:%02d:%02d [loggers.py:236] Engine 000: Avg prompt throughput: %.1f tokens/s, "
         b"Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, "
         b"Prefix cache hit rate: 0.0%%")
ACCESS = b'(APIServer pid=7) INFO:     127.0.0.1:%d - "POST /v1/completions HTTP/1.1" 200 OK'
OOM = (b"(EngineCore_DP0 pid=9) ERROR 11-29 10:59:59 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. "
       b"Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.72 GiB of which 1.19 GiB is free.")


def serving_log(n: int, seed: int, long_every: int = 0, crlf: bool = False, tail: bytes = b"") -> bytes:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        r = rnd.random()
        if long_every and i % long_every == long_every - 1:
            out.append(b"x" * rnd.choice((100, 5000, MAX_LINE_BYTES + 10)) + b" CUDA out of memory")
        elif r < 0.6:
            out.append(STATS % (i // 60 % 60, i % 60, rnd.uniform(0, 999), rnd.uniform(0, 99), rnd.randint(0, 64),
                                rnd.randint(0, 30), rnd.uniform(90, 100) if rnd.random() < 0.2 else rnd.uniform(0, 90)))
        else:
            out.append(ACCESS % rnd.randint(1000, 65000))
    body = (b"\r\n" if crlf else b"\n").join(out) + b"\n" + OOM + b"\n" + tail
    return body


@needs_fork
@pytest.mark.slow
@pytest.mark.parametrize("case", ["plain", "long-lines", "crlf", "no-final-newline", "gzip"])
def test_cut_badly_same_as_one_process(tmp_path, case):
    data = serving_log(3 * MAX_SAMPLES, seed=len(case), long_every=97 if case == "long-lines" else 0,
                       crlf=case == "crlf", tail=b"INFO 11-29 [loggers.py:1] last line" if case == "no-final-newline" else b"")
    log = tmp_path / ("serve.log.gz" if case == "gzip" else "serve.log")
    log.write_bytes(gzip.compress(data) if case == "gzip" else data)
    want = summary(diagnose_file(log, RULES))
    for jobs, piece in ((2, 1000), (5, 64 * 1024), (3, 333)):
        assert summary(in_parallel(log, jobs, piece)) == want, (jobs, piece)
    assert want["class"][0] == "kv_preemption" or want["root"] is not None
    rt = want["runtime"]
    assert rt["stats_lines"] > MAX_SAMPLES > len(rt["timeline"])      # the timeline's window widened


@needs_fork
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("zstd") is None, reason="needs the zstd program to build the log")
def test_a_zstd_log_same_as_one_process(tmp_path):
    raw = tmp_path / "serve.log"
    raw.write_bytes(serving_log(9000, seed=9, long_every=101))
    log = tmp_path / "serve.log.zst"
    subprocess.run(["zstd", "-q", "-f", str(raw), "-o", str(log)], check=True)
    want = summary(diagnose_file(log, RULES))
    for jobs, piece in ((2, 1000), (3, 4096)):
        assert summary(in_parallel(log, jobs, piece)) == want, (jobs, piece)
    assert want["source"][4] and want["class"][0] == "runtime_oom"


@needs_fork
@pytest.mark.slow
def test_the_environment_turns_it_on_and_workers_do_not_outlive_it(tmp_path, monkeypatch):
    log = tmp_path / "serve.log"
    log.write_bytes(serving_log(2000, seed=5))
    forked: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid:
            forked.append(pid)
        return pid
    monkeypatch.setattr(parallel.os, "fork", fork)
    monkeypatch.setenv("OOMDOCTOR_JOBS", "3")
    got = summary(diagnose_file(log, RULES))
    assert len(forked) == 3
    for pid in forked:                                   # reaped: no such child any more
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    monkeypatch.setenv("OOMDOCTOR_JOBS", "1")
    assert summary(diagnose_file(log, RULES)) == got and len(forked) == 3


@needs_fork
@pytest.mark.slow
def test_a_truncated_gzip_is_refused_as_in_one_process(tmp_path):
    log = tmp_path / "serve.log.gz"
    log.write_bytes(gzip.compress(serving_log(3000, seed=6))[:-1000])
    with pytest.raises(BadInput) as one:
        diagnose_file(log, RULES)
    with pytest.raises(BadInput) as par:
        in_parallel(log, 3, 4096)
    assert "truncated or corrupt gzip" in str(one.value) and str(par.value) == str(one.value)


def test_jobs_for_small_logs_and_the_environment(tmp_path, monkeypatch):
    log = tmp_path / "a.log"
    log.write_bytes(b"x\n")
    monkeypatch.delenv("OOMDOCTOR_JOBS", raising=False)
    assert parallel.jobs_for(log, GREP, ANCHORS) == 0                  # small: one process
    assert parallel.jobs_for(log, None, ANCHORS) == 0                  # no grep: the Python scanner
    monkeypatch.setenv("OOMDOCTOR_JOBS", "4")
    assert parallel.jobs_for(log, GREP, ANCHORS) == (4 if GREP and parallel.fcntl else 0)
    monkeypatch.setenv("OOMDOCTOR_JOBS", "many")
    if GREP and parallel.fcntl:
        with pytest.raises(BadInput):
            parallel.jobs_for(log, GREP, ANCHORS)


def _frames(buf: bytes) -> list[tuple[int, int, bytes, int]]:
    out, pos = [], 0
    while pos < len(buf):
        first, offset, length, nl = parallel._HEAD.unpack_from(buf, pos)
        pos += parallel._HEAD.size
        body = b"" if offset >= 0 else buf[pos:pos + length]
        pos += 0 if offset >= 0 else length
        out.append((first, offset, body if offset < 0 else length, nl))
    return out


@needs_fork
@pytest.mark.parametrize("by_offset", [False, True])
def test_dispatcher_frames_rebuild_the_stream_with_first_line_numbers(by_offset):
    rnd = random.Random(7)
    lines = [b"y%d" % i + b"y" * rnd.choice((0, 3, 50, 700, 3000)) for i in range(400)]
    data = b"\n".join(lines) + b"\nlast"
    pipes = [os.pipe() for _ in range(3)]
    for r, _ in pipes:
        os.set_blocking(r, False)
    sink = parallel.Dispatcher([w for _, w in pipes], piece=512, by_offset=by_offset)
    got: dict[int, bytearray] = {r: bytearray() for r, _ in pipes}

    def drain() -> None:
        for r, _ in pipes:
            try:
                while chunk := os.read(r, 1 << 16):
                    got[r] += chunk
            except BlockingIOError:
                pass
    for i in range(0, len(data), 997):                   # writes of odd sizes, drained as they go
        sink.write(memoryview(data)[i:i + 997])
        drain()
    sink.close()
    drain()
    per_worker = [_frames(bytes(got[r])) for r, _ in pipes]
    for r, _ in pipes:
        os.close(r)
    # each worker's frames, in order: a piece (first line >= 0) then its continuations (-1); rebuild every piece
    pieces = []
    for frames in per_worker:
        for first, offset, body, nl in frames:
            if by_offset:
                assert offset >= 0
                body = data[offset:offset + body]
            assert body.count(b"\n") == nl
            if first >= 0:
                pieces.append([first, body])
            else:
                pieces[-1][1] += body
    pieces.sort()
    assert b"".join(b for _, b in pieces) == data                  # the stream, whole and in order
    text_lines = data.split(b"\n")
    for first, body in pieces:                                    # each piece starts at the line it names
        assert body.split(b"\n")[0] == text_lines[first - 1]
    assert len(pieces) > 20 and any(len(b) > 512 for _, b in pieces)   # cut, and long lines kept whole


def _tracker_over(lines: list[int]) -> RuntimeTracker:
    t = RuntimeTracker()
    for n in lines:
        t._sample(Sample(n, "", 50.0, 1, 0, None))
    return t


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=50_000), min_size=1, max_size=3 * MAX_SAMPLES, unique=True),
       st.lists(st.integers(min_value=0, max_value=3 * MAX_SAMPLES), max_size=6))
def test_timeline_of_pieces_merges_to_the_timeline_of_the_whole(lines, cuts):
    lines.sort()
    whole = _tracker_over(lines)
    bounds = [0] + sorted(set(min(c, len(lines)) for c in cuts)) + [len(lines)]
    parts = [_tracker_over(lines[a:b]) for a, b in zip(bounds, bounds[1:])]
    samples, win = merge_samples([(p.samples, p._win) for p in parts])
    assert [s.line for s in samples] == [s.line for s in whole.samples] and win == whole._win
    assert len(whole.samples) < MAX_SAMPLES
    # the first stats line of every window of the final width
    firsts = sorted({n // whole._win: n for n in reversed(lines)}.values())
    assert [s.line for s in whole.samples] == firsts
