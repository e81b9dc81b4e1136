"""Multi-member gzip (what ``logrotate`` and ``cat a.gz b.gz`` produce): every member is read, once, by both
scanners, with the right line numbers, in bounded memory — also when a member decompresses to more than the
4 MiB chunk the reader works in (zlib then leaves the next member's bytes in both ``unused_data`` and
``unconsumed_tail``; feeding both back in made the default scanner read garbage)."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from oomdoctor.diagnose.read import CHUNK, SourceInfo, inflate, iter_lines
from oomdoctor.diagnose.rules import anchors_of, default_rules
from oomdoctor.diagnose.scan import scan_grep, scan_python

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
GREP = shutil.which("grep")
RULES = default_rules()
ANCHORS = sorted(anchors_of(RULES.rules, RULES.engines.values()))


def _noise(n_lines: int, seed: int) -> bytes:
    """Serving-log-like lines that do not compress away (so a member spans several input chunks)."""
    rnd = random.Random(seed)
    return b"".join(b"INFO 11-29 10:%02d:%02d [loggers.py:123] Engine 000: Avg prompt throughput: %d.%d tokens/s "
                    b"req %016x\n" % (i % 60, i % 59, rnd.randrange(10**4), i % 10, rnd.getrandbits(64))
                    for i in range(n_lines))


def _members(tmp_path: Path) -> tuple[Path, bytes]:
    big = _noise(120_000, 1)                            # ~11 MiB plain, > 2 chunks of output, > 1 chunk of input
    assert len(big) > 2 * CHUNK and len(gzip.compress(big)) > CHUNK // 2
    plain = big + FIX.joinpath("A_fail.log").read_bytes() + _noise(40_000, 2)
    parts = [big, FIX.joinpath("A_fail.log").read_bytes(), _noise(40_000, 2)]
    p = tmp_path / "rotated.log.gz"
    p.write_bytes(b"".join(gzip.compress(x) for x in parts) + b"\x00" * 64)
    return p, plain


def test_inflate_reads_every_member_of_a_big_multi_member_file_once(tmp_path):
    p, plain = _members(tmp_path)
    h = hashlib.sha256()
    with open(p, "rb") as f:
        pieces = list(inflate(f, h))
    assert b"".join(pieces) == plain
    assert max(len(x) for x in pieces) <= CHUNK
    assert h.hexdigest() == hashlib.sha256(p.read_bytes()).hexdigest()


def test_inflate_still_refuses_truncation_and_trailing_garbage(tmp_path):
    p, _ = _members(tmp_path)
    data = p.read_bytes().rstrip(b"\x00")
    for bad, exc in ((data[:-200], EOFError), (data + b"not gzip", zlib.error)):
        with pytest.raises(exc):
            list(inflate(io.BytesIO(bad), hashlib.sha256()))


@pytest.mark.skipif(GREP is None, reason="no grep on PATH")
def test_both_scanners_count_lines_of_a_big_multi_member_file(tmp_path):
    p, plain = _members(tmp_path)
    want = plain.count(b"\n")
    ip, ig = SourceInfo(str(p)), SourceInfo(str(p))
    py = list(scan_python(p, ANCHORS, ip))
    gr = list(scan_grep(p, ANCHORS, ig, GREP))
    assert gr == py and py
    assert ig.lines == ip.lines == want
    assert sum(1 for _ in iter_lines(p)) == want
    first_a = 120_000 + 1                               # the real log starts after the first member's lines
    assert min(n for n, _ in gr) >= first_a


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc for the peak RSS")
def test_a_large_multi_member_gzip_streams_in_bounded_memory(tmp_path):
    """~600 MB of log in 6 members (over 4 MiB each) ending in a real failure: diagnose classifies it and its peak
    RSS stays far below the file's decompressed size."""
    p = tmp_path / "huge.log.gz"
    block = _noise(20_000, 3)                           # ~1.9 MB, repeated: cheap to make, still > CHUNK per member
    with open(p, "wb") as f:
        for _ in range(6):
            f.write(gzip.compress(block * 52, compresslevel=1))   # ~100 MB plain per member
        f.write(gzip.compress(FIX.joinpath("A_fail.log").read_bytes()))
    total = 6 * 52 * len(block) + len(FIX.joinpath("A_fail.log").read_bytes())
    assert total > 500_000_000
    # VmHWM: this process's own peak (ru_maxrss would carry over the parent's peak across fork + exec)
    code = ("import re, sys, runpy; sys.argv = ['oomdoctor'] + sys.argv[1:]\n"
            "try:\n    runpy.run_module('oomdoctor', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
            "    print('RC', e.code, 'RSS', hwm, file=sys.stderr)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code, "diagnose", str(p), "--no-card", "--no-device", "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    tail = r.stderr.strip().splitlines()[-1]
    rc, rss_kib = int(tail.split()[1]), int(tail.split()[3])
    assert rc == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["classification"]["class"] == "kv_capacity"
    assert rss_kib * 1024 < 200_000_000, f"peak RSS {rss_kib} KiB"
