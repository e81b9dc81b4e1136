"""What a log path can be besides a regular UTF-8 file: a FIFO or a device given by name is refused with one line
(never waited on), a UTF-16 log with its BOM is read like its UTF-8 twin (plain or gzip, both scanners), and a few
stray bytes (a NUL, a broken UTF-8 sequence) inside a real log do not make it binary."""
from __future__ import annotations

import gzip
import os
import threading
from pathlib import Path

import pytest

from conftest import FIXTURES, invoke
from oomdoctor.diagnose.read import SourceInfo, iter_lines, looks_binary, read_capped
from oomdoctor.errors import BadInput

A_FAIL = FIXTURES / "A_fail.log"


def diagnose(path: Path, *extra: str):
    return invoke("diagnose", path, "--no-device", "--no-card", "--json", *extra)


def one_line_error(r, contains: str) -> None:
    assert r.rc == 2 and len(r.err.splitlines()) == 1, (r.rc, r.err)
    assert r.err.startswith("oomdoctor: error:") and contains in r.err and "Traceback" not in r.err


def _in_thread(fn, timeout: float = 30.0):
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("r", fn()), daemon=True)
    t.start()
    t.join(timeout)
    return t, box


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_given_by_name_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "live.log"
    os.mkfifo(fifo)
    t, box = _in_thread(lambda: diagnose(fifo))
    if t.is_alive():                       # unblock the reader so that the test run can go on, then fail
        with open(fifo, "wb"):
            pass
        t.join(10)
        pytest.fail("diagnose waited on a FIFO")
    one_line_error(box["r"], "FIFO")
    t, box = _in_thread(lambda: invoke("diagnose", A_FAIL, "--no-device", "--no-card", "--metrics", str(fifo)))
    assert not t.is_alive(), "--metrics waited on a FIFO"
    one_line_error(box["r"], "FIFO")


@pytest.mark.parametrize("dev", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused(dev):
    if not os.path.exists(dev):
        pytest.skip(f"no {dev}")
    t, box = _in_thread(lambda: diagnose(Path(dev)))
    assert not t.is_alive(), f"diagnose read {dev} without end"
    one_line_error(box["r"], "a device")
    with pytest.raises(BadInput, match="a device"):
        read_capped(dev, 10, "card")


def test_read_capped_refuses_what_is_larger_than_its_cap(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"x" * 101)
    assert read_capped(p, 101) == b"x" * 101
    with pytest.raises(BadInput, match="larger than 100 bytes"):
        read_capped(p, 100, "card")


@pytest.mark.parametrize("enc", ["utf-16", "utf-16-be-bom"])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("scanner", ["auto", "python"])
def test_a_utf16_log_reads_like_its_utf8_twin(tmp_path, enc, gz, scanner):
    text = A_FAIL.read_text()
    data = (b"\xfe\xff" + text.encode("utf-16-be")) if enc == "utf-16-be-bom" else text.encode("utf-16")
    p = tmp_path / ("a16.log.gz" if gz else "a16.log")
    p.write_bytes(gzip.compress(data) if gz else data)
    ref, got = diagnose(A_FAIL, "--scanner", scanner), diagnose(p, "--scanner", scanner)
    assert got.rc == ref.rc == 0, got.err
    g, r = got.json(), ref.json()
    assert g["classification"] == r["classification"] and g["numbers"] == r["numbers"]
    assert [(e["line"], e["text"]) for e in g["evidence"]] == [(e["line"], e["text"]) for e in r["evidence"]]
    info = SourceInfo(str(p))
    lines = list(iter_lines(p, info))
    assert [ln for _, ln in lines] == [ln.encode() for ln in text.splitlines()]
    assert info.size_bytes == p.stat().st_size


def test_stray_nul_and_broken_utf8_inside_a_real_log_do_not_make_it_binary(tmp_path):
    raw = A_FAIL.read_bytes()
    cut = raw.index(b"\n", 2000) + 1
    p = tmp_path / "stray.log"
    p.write_bytes(raw[:cut] + b"INFO stray \x00 NUL and \xc3( broken \xff bytes\n" + raw[cut:])
    r = diagnose(p)
    assert r.rc == 0, r.err
    assert r.json()["classification"]["class"] == "kv_capacity"
    assert not looks_binary(p.read_bytes()[:65536])
    assert looks_binary(b"\x00" * 64 + b"INFO x\n")          # mostly not text is still refused
