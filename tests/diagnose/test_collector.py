"""Stage 1a, collector: Docker's json-file log of any size (and its gzipped rotation) is read as its records' text —
a large one as a stream to a private copy — so the rules see the engine's own lines (frames, the exception), not
JSON with escaped quotes. Records are written as moby's json-file driver writes them: "log" first, no blanks, Go's
HTML-safe escapes (jsonlog/jsonlogbytes.go), a long line split into pieces without a newline."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import assert_reads_as

from oomdoctor.diagnose import collector, paste
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-0.25.1-h200"
RULES = default_rules()
HEALTH = 'INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK\n'


def record(text: str, stream: str = "stderr", i: int = 0) -> str:
    body = json.dumps(text)[1:-1].replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'{{"log":"{body}","stream":"{stream}","time":"2026-12-01T21:35:35.{i:09d}Z"}}\n'


def json_file(log: Path, health: int) -> str:
    lines = [ln for ln in log.read_text(encoding="utf-8").splitlines(True) if not ln.startswith("# ")]
    return "".join([record(HEALTH, "stdout")] * health + [record(ln, i=i) for i, ln in enumerate(lines)])


@pytest.mark.parametrize("name", ["D_fail", "C2_fail", "F1b_fail", "E_pass"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_large_json_file_log_is_diagnosed_as_the_log(name, gz, tmp_path):
    text = json_file(H200 / f"{name}.log", health=30000)     # > paste.PASTE_MAX_BYTES: not a paste
    p = tmp_path / (f"{name}-json.log.1.gz" if gz else f"{name}-json.log")
    data = gzip.compress(text.encode()) if gz else text.encode()
    p.write_bytes(data)
    assert len(text) > paste.PASTE_MAX_BYTES
    got = diagnose_file(p, RULES)
    assert_reads_as(got, diagnose_file(H200 / f"{name}.log", RULES))
    assert any(n.startswith("read as Docker's json-file log: the text of its 30") for n in got.notes)
    assert got.source.sha256 == hashlib.sha256(data).hexdigest() and got.source.size_bytes == len(data)


def test_a_record_split_by_the_driver_is_one_line_and_a_line_that_is_no_record_stays(tmp_path):
    p = tmp_path / "c-json.log"
    p.write_text(record(HEALTH) * 40000 + record("torch.OutOfMemoryError: CUDA out of memory. Tried to ")
                 + record("allocate 2.00 GiB.\n") + "an editor's line\n" + '{"log":"cut', encoding="utf-8")
    with paste.readable(p) as r:
        lines = r.path.read_text(encoding="utf-8").splitlines()
        assert r.read_as == "Docker's json-file log" and r.path != p
    assert lines[-3:] == ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                          "an editor's line", '{"log":"cut']
    assert not r.path.exists()          # the private copy is gone after the diagnosis


@pytest.mark.parametrize("first", [
    '{"level":"error","msg":"CUDA out of memory"}',           # JSON lines of another logger
    '{"log": "spaced", "stream": "stderr"}',                   # not how the driver writes a record
    '{"log":"unterminated',                                    # cut
    '{"log":"x","attrs":' + "[" * 100000 + "]" * 100000 + "}",  # nesting past the parser's depth
    '{"log":"x","stream":"stderr"}' + "\x00" * 3,
])
def test_what_is_no_json_file_record_is_read_as_it_is(first, tmp_path):
    p = tmp_path / "x.log"
    p.write_text(first + "\n" + HEALTH * 50000, encoding="utf-8")
    assert not collector.is_docker_json(p)
    with paste.readable(p) as r:
        assert r.path == p and r.undone == []


def test_an_unreadable_path_is_left_to_the_reader(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not collector.is_docker_json(fifo)          # never opened for reading: no hang
    assert not collector.is_docker_json(tmp_path / "missing.log")
