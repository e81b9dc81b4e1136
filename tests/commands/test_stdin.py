"""Logs from stdin: `journalctl -u vllm | oomdoctor diagnose -`, `diagnose - < engine.log`, `diagnose /dev/stdin`.

The same bytes on stdin give the same diagnosis as the same bytes in a file (plain or gzip); only the card's
``source.path`` says ``<stdin>``. Bad stdin gets the one-line error, naming ``<stdin>``, never a temp file.
"""
from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"


def essence(d: dict) -> dict:
    """Everything but where the bytes came from."""
    return {k: v for k, v in d.items() if k not in ("source", "card")}


CASES = ["A_fail.log", "B_fail.log", "C2_fail.log", "E_pass.log", "A_pass.log"]


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


def _diag(cli, arg, tmp_path: Path, tag: str) -> tuple[int, dict]:
    r = cli("diagnose", arg, "--no-device", "--json", "--out", tmp_path / f"{tag}.yaml")
    assert r.err == "", r.err
    return r.rc, r.json()


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("arg", ["-", "/dev/stdin"])
def test_stdin_gives_the_files_result(cli, tmp_path, monkeypatch, name, arg):
    rc_file, from_file = _diag(cli, FIX / name, tmp_path, "file")
    _stdin(monkeypatch, (FIX / name).read_bytes())
    rc, from_stdin = _diag(cli, arg, tmp_path, "stdin")
    assert rc == rc_file
    assert essence(from_stdin) == essence(from_file)
    assert from_stdin["source"]["path"] == "<stdin>"
    assert from_stdin["source"]["sha256"] == from_file["source"]["sha256"]


def test_gzip_on_stdin(cli, tmp_path, monkeypatch):
    rc_file, from_file = _diag(cli, FIX / "A_fail.log", tmp_path, "file")
    _stdin(monkeypatch, gzip.compress((FIX / "A_fail.log").read_bytes()))
    rc, from_stdin = _diag(cli, "-", tmp_path, "stdin")
    assert (rc, from_stdin["classification"]["class"]) == (rc_file, "kv_capacity")
    assert essence(from_stdin) == essence(from_file)
    assert from_stdin["source"]["compressed"] is True


def test_the_card_written_from_stdin_names_stdin(cli, tmp_path, monkeypatch):
    import yaml

    _stdin(monkeypatch, (FIX / "D_fail.log").read_bytes())
    r = cli("diagnose", "-", "--no-device", "--out", tmp_path / "d.yaml")
    assert r.rc == 0, r.err
    card = yaml.safe_load((tmp_path / "d.yaml").read_text())
    assert card["source"]["path"] == "<stdin>"
    assert card["classification"]["class"] == "kv_allocation_oom"


@pytest.mark.parametrize("data,says", [(b"", "the log is empty"), (b"\x00\x01\x02" * 100, "binary data"),
                                       (gzip.compress(b"INFO x\n" * 1000)[:40], "truncated or corrupt gzip")])
def test_bad_stdin_is_one_line_naming_stdin(cli, tmp_path, monkeypatch, data, says):
    _stdin(monkeypatch, data)
    r = cli("diagnose", "-", "--no-device", "--no-card")
    assert r.rc == 2
    assert r.err_lines == [r.err_lines[0]] and r.err.startswith("oomdoctor: error: <stdin>: ") and says in r.err
    assert "oomdoctor-stdin-" not in r.err


class _Endless(io.RawIOBase):
    """A stdin that never ends (`< /dev/zero`, `yes |`): ``unit`` again and again, counting what was read."""

    def __init__(self, unit: bytes):
        self.unit, self.given = unit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = len(b) - len(b) % len(self.unit)
        b[:n] = self.unit * (n // len(self.unit))
        self.given += n
        return n


@pytest.mark.parametrize("unit,env,says", [(b"\x00", None, "binary data"),
                                           (b"INFO hello\n", "20000000", "more than 20,000,000 bytes")])
def test_stdin_that_never_ends_is_refused_not_spooled_forever(cli, monkeypatch, unit, env, says):
    """`oomdoctor diagnose - < /dev/zero` wrote 4 GB into the temporary folder in 20 s and never stopped (the
    spool judged nothing until stdin ended); a text stream that never ends filled the disk the same way."""
    src = _Endless(unit)

    class Wrapper:
        buffer = io.BufferedReader(src)

    monkeypatch.setattr(sys, "stdin", Wrapper())
    if env:
        monkeypatch.setenv("OOMDOCTOR_STDIN_MAX_BYTES", env)
    r = cli("diagnose", "-", "--no-device", "--no-card")
    assert r.rc == 2 and r.err.startswith("oomdoctor: error: <stdin>: ") and says in r.err, r.err
    assert src.given < 64 << 20


def test_a_terminal_on_stdin_is_refused_not_waited_for(cli, monkeypatch):
    class Tty(io.BytesIO):
        def isatty(self) -> bool:
            return True

    class Wrapper:
        buffer = Tty()

    monkeypatch.setattr(sys, "stdin", Wrapper())
    r = cli("diagnose", "-", "--no-device", "--no-card")
    assert r.rc == 2 and r.err.startswith("oomdoctor: error: -: stdin is a terminal")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["pipe -", "redirect -", "pipe /dev/stdin", "redirect /dev/stdin"])
def test_the_shell_ways(tmp_path, how):
    """A real pipe and a real redirect (fd 0 is then the file itself): the grep prefilter runs in its own process,
    where /dev/stdin is not the log — the reason stdin is spooled."""
    kind, arg = how.split()
    log = FIX / "A_fail.log"
    cmd = [sys.executable, "-m", "oomdoctor", "diagnose", arg, "--json", "--no-device", "--no-card", "--scanner", "grep"]
    if kind == "pipe":
        with subprocess.Popen(["cat", str(log)], stdout=subprocess.PIPE) as cat:
            r = subprocess.run(cmd, stdin=cat.stdout, capture_output=True, text=True, cwd=ROOT)
    else:
        with open(log, "rb") as f:
            r = subprocess.run(cmd, stdin=f, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["classification"]["class"] == "kv_capacity"
    assert d["levers"][0]["change"] == {"max_model_len": 1998848}


def test_compare_reads_one_side_from_stdin(cli, monkeypatch):
    from_files = cli("compare", FIX / "D_pass.log", FIX / "D_fail.log", "--json")
    _stdin(monkeypatch, (FIX / "D_fail.log").read_bytes())
    from_stdin = cli("compare", FIX / "D_pass.log", "-", "--json")
    assert from_stdin.rc == from_files.rc == 0, from_stdin.err
    a, b = from_files.json(), from_stdin.json()
    assert b["failing"]["path"] == "<stdin>" and "oomdoctor-stdin-" not in from_stdin.out
    b["failing"]["path"] = a["failing"]["path"]
    assert a == b


def test_compare_refuses_stdin_twice(cli, monkeypatch):
    _stdin(monkeypatch, b"")
    r = cli("compare", "-", "/dev/stdin")
    assert r.rc == 2 and r.err_lines == ["oomdoctor: error: only one of PROVEN and FAILING can be read from stdin (-)"]


@pytest.mark.slow
def test_sigterm_while_spooling_stdin_leaves_no_spool(tmp_path):
    # `yes "INFO hello" | timeout 5 oomdoctor diagnose -` had left /tmp/oomdoctor-stdin-* (861 MB): SIGTERM ended
    # Python without the temporary folder's cleanup
    import os
    import signal
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "oomdoctor", "diagnose", "-", "--no-card", "--no-device"],
                         stdin=subprocess.PIPE, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
    assert p.stdin is not None
    t0 = time.monotonic()
    while not list(tmp_path.glob("oomdoctor-stdin-*")) and time.monotonic() - t0 < 30:
        p.stdin.write(b"INFO hello\n" * 1000)
        p.stdin.flush()
    assert list(tmp_path.glob("oomdoctor-stdin-*")), "the spool never appeared"
    p.send_signal(signal.SIGTERM)
    p.stdin.close()
    assert p.wait(timeout=30) == 143
    assert p.stderr is not None and p.stderr.read().decode().strip() == "oomdoctor: terminated"
    assert not list(tmp_path.glob("oomdoctor-stdin-*"))
