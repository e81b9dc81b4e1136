"""zstd logs are read like gzip ones (same lines, the file's own sha256, both scanners, one-line errors), and the
progress line: after a second only, on stderr, never under --json or --quiet."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from oomdoctor.cli import cli
from oomdoctor.diagnose import feed, progress
from oomdoctor.diagnose.read import SourceInfo
from oomdoctor.diagnose.rules import anchors_of, default_rules
from oomdoctor.diagnose.scan import scan_grep, scan_python
from oomdoctor.errors import BadInput

from tests.diagnose.test_scan import FIX, NASTY, reference_lines

RULES = default_rules()
ANCHORS = sorted(anchors_of(RULES.rules, RULES.engines.values()))
ZSTD = shutil.which("zstd")
needs_zstd = pytest.mark.skipif(ZSTD is None, reason="no zstd program")


def zst(tmp_path, name: str, data: bytes, frames: int = 1):
    """``data`` compressed by the zstd program, in ``frames`` frames (zstd -dc reads them all)."""
    step = max(1, len(data) // frames)
    out = b""
    for i in range(0, len(data), step):
        out += subprocess.run([ZSTD, "-q", "-c", "-3"], input=data[i:i + step], capture_output=True, check=True).stdout
    p = tmp_path / f"{name}.zst"
    p.write_bytes(out)
    return p


@needs_zstd
@pytest.mark.slow
@pytest.mark.parametrize("name", ["E_pass.log", "A_fail.log", "crlf", "long_line_across_chunks", "several_long_lines"])
def test_zstd_same_lines_and_info_as_plain_on_both_scanners(tmp_path, name):
    data = (FIX / name).read_bytes() if name.endswith(".log") else NASTY[name]
    p = zst(tmp_path, name, data, frames=2)
    ref, nlines, cut = reference_lines(data)
    ip, ig = SourceInfo(str(p)), SourceInfo(str(p))
    assert list(scan_python(p, ANCHORS, ip)) == ref
    assert list(scan_grep(p, ANCHORS, ig, shutil.which("grep"))) == ref
    assert dataclasses.asdict(ip) == dataclasses.asdict(ig)
    assert ig.sha256 == hashlib.sha256(p.read_bytes()).hexdigest() and ig.compressed
    assert ig.lines == nlines and ig.cut_lines == cut and ig.size_bytes == p.stat().st_size


@needs_zstd
@pytest.mark.slow
def test_truncated_zstd_is_one_line_bad_input(tmp_path):
    p = zst(tmp_path, "cut.log", (FIX / "F1b_fail.log").read_bytes() * 50)
    p.write_bytes(p.read_bytes()[:-200])
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "diagnose", str(p), "--no-card", "--no-device"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("oomdoctor: error:") and "truncated or corrupt zstd" in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("grep") is None, reason="no grep on PATH")
def test_zstd_without_program_or_package_says_what_to_install(tmp_path, monkeypatch):
    p = tmp_path / "x.log.zst"
    p.write_bytes(feed.ZSTD_MAGIC + b"\x00" * 32)
    grep = shutil.which("grep")
    monkeypatch.setattr(feed.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "zstandard", None)         # import zstandard fails
    with pytest.raises(BadInput, match="needs the zstd program or the Python package zstandard") as e:
        list(scan_python(p, ANCHORS, SourceInfo(str(p))))
    assert str(e.value).startswith(f"{p}: a zstd-compressed log") and str(e.value).count(str(p)) == 1
    with pytest.raises(BadInput) as e:
        list(scan_grep(p, ANCHORS, SourceInfo(str(p)), grep))
    assert str(e.value).startswith(f"{p}: a zstd-compressed log") and str(e.value).count(str(p)) == 1


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_progress_only_after_a_second_and_then_throttled():
    out, clock = io.StringIO(), Clock()
    p = progress.Progress(420_000_000, stream=out, clock=clock)
    p.update(10_000_000, 50_000)
    clock.t += 0.9
    p.update(20_000_000, 90_000)
    assert out.getvalue() == ""                                   # a log read in under a second: nothing
    clock.t += 0.2
    p.update(40_000_000, 200_000)
    first = out.getvalue()
    assert first == "oomdoctor: 40 MB of 420 MB read, 200,000 lines matched through, 0.18M lines/s\n"
    clock.t += 1.0
    p.update(60_000_000, 300_000)                                 # not a terminal: every 5 s
    assert out.getvalue() == first
    p.done(420_000_000, 2_000_000)
    assert out.getvalue().splitlines()[-1].endswith("2,000,000 lines matched through, 0.95M lines/s (done)")


def test_no_done_line_when_nothing_was_shown():
    out = io.StringIO()
    p = progress.Progress(None, stream=out, clock=Clock())
    p.done(1, 1)
    assert out.getvalue() == ""


@pytest.mark.slow
@pytest.mark.parametrize("args, shown", [([], True), (["--quiet"], False), (["--json"], False)])
def test_cli_progress_on_stderr_off_with_quiet_and_json(monkeypatch, args, shown):
    monkeypatch.setattr(progress, "AFTER_S", -1.0)                # show from the first block on
    r = CliRunner().invoke(cli, ["diagnose", str(FIX / "A_fail.log"), "--no-card", "--no-device"] + args)
    assert r.exit_code == 0, r.stderr
    assert ("MB of" in r.stderr and "lines matched through" in r.stderr) == shown
    assert "lines matched through" not in r.stdout
    if "--json" in args:
        assert json.loads(r.stdout)["classification"]["class"] == "kv_capacity"
