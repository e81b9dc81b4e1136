"""`oomdoctor diagnose` through the CLI (in-process) on the real vLLM 0.25.1 H200 logs.

Every fixture gets the class its ORIGIN.md names; the JSON carries the contract's keys; evidence
points at the real lines; the card is valid YAML that card.load_dict accepts; and the same log
gzipped, with CRLF + ANSI colours, or interleaved with another process's lines, diagnoses the same.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import re
from pathlib import Path

import pytest
import yaml

from oomdoctor.card import store as cardmod
from oomdoctor import contract

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-0.25.1-h200"
GiB = 1 << 30

# fixture → (class, exit code), from fixtures/logs/vllm-0.25.1-h200/ORIGIN.md
EXPECTED = {
    "A_fail.log": ("kv_capacity", 0),
    "B_fail.log": ("free_memory_below_utilization", 0),
    "C2_fail.log": ("weights_load_oom", 0),
    "D_fail.log": ("kv_allocation_oom", 0),
    "F1b_fail.log": ("cuda_graph_oom", 0),
    "E_pass.log": ("kv_preemption", 0),
    "Eserve_pass.log": ("kv_preemption", 0),
    "A_pass.log": ("unknown", 3),
    "B_pass.log": ("unknown", 3),
    "D_pass.log": ("unknown", 3),
    "F1b_pass.log": ("unknown", 3),
    "F2_fail.log": ("unknown", 3),
}
ALL = sorted(EXPECTED)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def test_every_fixture_is_covered():
    assert sorted(p.name for p in FIX.glob("*.log")) == ALL


def file_lines(path: Path) -> list[str]:
    """The file's lines as oomdoctor shows them: decoded, ANSI removed, line ending stripped."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return [ANSI.sub("", raw.decode("utf-8", errors="replace")).rstrip("\r\n") for raw in data.split(b"\n")]


def diagnose(cli, log: Path, tmp_path: Path, *extra) -> tuple[int, dict, Path]:
    out = tmp_path / f"{log.name}.card.yaml"
    r = cli("diagnose", log, "--no-device", "--json", "--out", out, *extra)
    assert r.err == "", r.err
    return r.rc, r.json(), out


def essence(d: dict) -> dict:
    """What must not change when only the file's encoding of the same lines changes."""
    return {k: d.get(k) for k in ("classification", "evidence", "numbers", "levers", "phase_reached", "runtime", "workload")}


# ----------------------------------------------------------------------------- the real logs
@pytest.mark.parametrize("name", ALL)
def test_fixture_class_exit_code_and_contract(cli, tmp_path, name):
    klass, rc_expected = EXPECTED[name]
    log = FIX / name
    rc, d, card_path = diagnose(cli, log, tmp_path)
    assert rc == rc_expected
    c = d["classification"]
    assert c["class"] == klass
    assert set(c) >= {"class", "phase", "type", "rule", "engine"}
    assert c["phase"] == contract.CLASSES[klass]["phase"]
    assert c["type"] == contract.CLASSES[klass]["type"]
    assert c["engine"] == "vllm"                          # every fixture is a vLLM log
    assert d["engine"]["version"] == "0.25.1"
    if klass == "unknown":
        assert c["rule"] is None
    else:
        assert isinstance(c["rule"], str) and c["rule"]

    # evidence: [{line, text}], each line number pointing at that text in the file
    lines = file_lines(log)
    assert isinstance(d["evidence"], list)
    if rc == 0:
        assert d["evidence"], "a classified failure carries evidence"
        assert any(e.get("role") == "root" for e in d["evidence"])
    for e in d["evidence"]:
        assert isinstance(e["line"], int) and 1 <= e["line"] <= len(lines)
        real = lines[e["line"] - 1]
        if e.get("rule") == "runtime.stats":             # a summary of the stats line, not its text
            m = re.match(r"KV usage ([\d.]+)%, running (\d+), waiting (\d+)", e["text"])
            assert m, e
            assert f"GPU KV cache usage: {m.group(1)}%" in real
            assert f"Running: {m.group(2)} reqs" in real and f"Waiting: {m.group(3)} reqs" in real
        else:
            assert e["text"] == real[:2000], (e["line"], e["text"], real)

    # numbers: byte quantities are ints, named *_bytes
    assert isinstance(d["numbers"], dict)
    for k, v in d["numbers"].items():
        if k.endswith("_bytes"):
            assert type(v) is int and v >= 0, (k, v)

    # levers: the first is the one to try, with id / change / predicted / cost
    if rc == 0:
        assert d["levers"], "a memory failure comes with a lever"
        lv = d["levers"][0]
        assert {"id", "change", "predicted", "cost"} <= set(lv)
        assert lv["id"] in contract.LEVERS
        assert isinstance(lv["change"], dict) and lv["change"]
        assert isinstance(lv["predicted"], dict)
        assert isinstance(lv["cost"], str) and lv["cost"]

    # the card: valid YAML, accepted by the schema check, the same classification
    assert d["card"] == str(card_path)
    raw = yaml.safe_load(card_path.read_text(encoding="utf-8"))
    assert isinstance(raw, dict)
    loaded = cardmod.load_dict(card_path)
    assert loaded["classification"]["class"] == klass
    assert loaded["source"]["sha256"] == hashlib.sha256(log.read_bytes()).hexdigest()
    assert loaded["source"]["lines"] == d["source"]["lines"] == log.read_bytes().count(b"\n")


def test_a_fail_numbers_and_lever(cli, tmp_path):
    """A_fail: 4,000,000-token window needs 244.14 GiB of KV, 124.52 GiB available."""
    rc, d, _ = diagnose(cli, FIX / "A_fail.log", tmp_path)
    assert rc == 0
    n = d["numbers"]
    assert n["max_model_len"] == 4_000_000
    assert abs(n["kv_needed_bytes"] - 244.14 * GiB) < 0.01 * GiB
    assert abs(n["kv_available_bytes"] - 124.52 * GiB) < 0.01 * GiB
    root = next(e for e in d["evidence"] if e["role"] == "root")
    assert root["line"] == 57 and "244.14 GiB KV cache is needed" in root["text"]
    lv = d["levers"][0]
    assert lv["id"] == "max_model_len"
    assert 0 < lv["change"]["max_model_len"] <= n["estimated_max_model_len"] < 4_000_000


def test_b_fail_lowers_utilization(cli, tmp_path):
    rc, d, _ = diagnose(cli, FIX / "B_fail.log", tmp_path)
    assert rc == 0
    assert d["numbers"]["gpu_memory_utilization"] == 0.92
    lv = d["levers"][0]
    assert lv["id"] == "gpu_memory_utilization" and lv["change"]["gpu_memory_utilization"] < 0.92
    # the change must pass vLLM's own start-up check with the free memory the log reports
    assert lv["predicted"]["requested_bytes"] <= d["numbers"]["free_at_start_bytes"]


def test_oom_roots_are_the_torch_oom_lines(cli, tmp_path):
    for name, phase in (("C2_fail.log", "weights_load"), ("D_fail.log", "kv_reservation"), ("F1b_fail.log", "cuda_graph")):
        rc, d, _ = diagnose(cli, FIX / name, tmp_path)
        assert rc == 0 and d["classification"]["phase"] == phase
        root = next(e for e in d["evidence"] if e["role"] == "root")
        assert "CUDA out of memory. Tried to allocate" in root["text"]
        assert type(d["numbers"]["tried_to_allocate_bytes"]) is int


def test_metrics_file_gives_the_preemption_count(cli, tmp_path):
    rc, d, _ = diagnose(cli, FIX / "Eserve_pass.log", tmp_path, "--metrics", FIX / "Eserve_client.txt")
    assert rc == 0
    assert d["classification"]["class"] == "kv_preemption"
    assert d["runtime"]["preemptions"] == 15
    assert d["runtime"]["preemptions_source"] == "metrics"
    assert d["numbers"]["preemptions_count"] == 15


@pytest.mark.parametrize("name", ALL)
def test_scanners_agree_through_the_cli(cli, tmp_path, name):
    """--scanner grep and --scanner python give the same diagnosis, line for line."""
    import shutil
    if not shutil.which("grep"):
        pytest.skip("no grep")
    _, a, _ = diagnose(cli, FIX / name, tmp_path / "g", "--scanner", "grep")
    _, b, _ = diagnose(cli, FIX / name, tmp_path / "p", "--scanner", "python")
    assert essence(a) == essence(b)
    assert {k: v for k, v in a["source"].items()} == {k: v for k, v in b["source"].items()}


# ----------------------------------------------------------------------------- same lines, other bytes
@pytest.mark.parametrize("name", ALL)
def test_gzipped_log_gives_the_same_result(cli, tmp_path, name):
    log = FIX / name
    rc, d, _ = diagnose(cli, log, tmp_path / "plain")
    gz = tmp_path / (name + ".gz")
    gz.write_bytes(gzip.compress(log.read_bytes()))
    rc_gz, d_gz, card_gz = diagnose(cli, gz, tmp_path / "gz")
    assert rc_gz == rc
    assert essence(d_gz) == essence(d)
    assert d_gz["source"]["compressed"] is True
    assert d_gz["source"]["lines"] == d["source"]["lines"]
    assert d_gz["source"]["sha256"] == hashlib.sha256(gz.read_bytes()).hexdigest()
    assert cardmod.load_dict(card_gz)["classification"] == cardmod.load_dict(tmp_path / "plain" / f"{name}.card.yaml")["classification"]


def colourize(line: bytes) -> bytes:
    """What a colour terminal logger adds: the level and the process prefix in colour (the capture
    harness's own '# ' header lines are not the logger's and stay plain)."""
    if line.startswith(b"# "):
        return line
    line = re.sub(rb"\b(INFO|WARNING|ERROR|DEBUG)\b", lambda m: b"\x1b[1;32m" + m.group(1) + b"\x1b[0m", line, count=1)
    if line.startswith(b"("):
        line = b"\x1b[36m" + line.replace(b") ", b")\x1b[0m ", 1)
    return line


@pytest.mark.parametrize("name", ALL)
def test_crlf_and_ansi_colours_give_the_same_result(cli, tmp_path, name):
    log = FIX / name
    rc, d, _ = diagnose(cli, log, tmp_path / "plain")
    lines = log.read_bytes().split(b"\n")
    copy = tmp_path / name
    copy.write_bytes(b"\r\n".join(colourize(ln) if ln else ln for ln in lines))
    assert b"\x1b[" in copy.read_bytes() and b"\r\n" in copy.read_bytes()
    rc2, d2, _ = diagnose(cli, copy, tmp_path / "crlf")
    assert rc2 == rc
    assert essence(d2) == essence(d)


NOISE = b"(Worker_TP1 pid=9) INFO 11-29 15:05:31 [custom_all_reduce.py:203] Registering 4563 cuda graph addresses"


@pytest.mark.parametrize("name", ALL)
def test_interleaved_lines_of_another_process_keep_the_class(cli, tmp_path, name):
    log = FIX / name
    rc, d, _ = diagnose(cli, log, tmp_path / "plain")
    lines = log.read_bytes().rstrip(b"\n").split(b"\n")
    copy = tmp_path / name
    copy.write_bytes(b"".join(ln + b"\n" + NOISE + b"\n" for ln in lines))
    rc2, d2, _ = diagnose(cli, copy, tmp_path / "mixed")
    assert rc2 == rc
    assert d2["classification"] == d["classification"]
    # line k of the original is line 2k-1 of the copy
    assert [(2 * e["line"] - 1, e["text"]) for e in d["evidence"] if e.get("rule") != "runtime.stats"] == \
        [(e["line"], e["text"]) for e in d2["evidence"] if e.get("rule") != "runtime.stats"]
    assert d2["numbers"] == d["numbers"]


# ----------------------------------------------------------------------------- the card cannot be written
def _one_line_error(r) -> None:
    assert r.rc == 2, (r.rc, r.err)
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("oomdoctor: error:"), r.err
    assert "Traceback" not in r.err


def test_card_under_a_regular_file_is_a_one_line_error(cli, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    r = cli("diagnose", FIX / "A_fail.log", "--no-device", "--out", blocker / "card.yaml")
    _one_line_error(r)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into a read-only directory")
def test_card_in_a_read_only_dir_is_a_one_line_error(cli, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = cli("diagnose", FIX / "A_fail.log", "--no-device", "--out", ro / "card.yaml")
    finally:
        ro.chmod(0o755)
    _one_line_error(r)
    assert not list(ro.iterdir())


def test_card_write_failure_is_one_line_without_traceback(cli, tmp_path):
    """What holds today even with the bug above: one line, no traceback, a non-zero exit, no partial card."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    r = cli("diagnose", FIX / "A_fail.log", "--no-device", "--out", blocker / "card.yaml")
    assert r.rc != 0
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("oomdoctor: ") and "Traceback" not in r.err
    assert blocker.read_text() == "x"
