"""Bad input to `oomdoctor diagnose`: exit 2 and exactly ONE line on stderr starting
'oomdoctor: error:' — no traceback — or, where the input is a legitimate text log, a correct
`unknown` and exit 3. Plus property tests: random bytes and random mixes of real lines never
crash, and a mix that keeps A_fail's lines in order still classifies kv_capacity."""
from __future__ import annotations

import gzip
import os
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomdoctor.diagnose.classify import diagnose_file, diagnose_lines
from oomdoctor.paths import rules_dir
from oomdoctor.errors import BadInput
from oomdoctor.diagnose.read import SourceInfo
from oomdoctor.diagnose.rules import default_rules

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
RULES = default_rules()


def one_line_error(r, *, contains: str | None = None) -> None:
    assert r.rc == 2, (r.rc, r.out[-500:], r.err)
    assert len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("oomdoctor: error:"), r.err
    assert "Traceback" not in r.err + r.out
    if contains:
        assert contains in r.err


def run(cli, log, *extra):
    return cli("diagnose", log, "--no-device", "--no-card", "--json", *extra)


# ----------------------------------------------------------------------------- not a text log
def _png() -> bytes:
    return (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00\x1f\xf3\xffa"
            + random.Random(1).randbytes(3000))


NOT_TEXT = {
    "random.bin": (random.Random(0).randbytes(200_000), "binary"),
    "image.png": (_png(), "binary"),
    "binary.gz": (gzip.compress(random.Random(2).randbytes(100_000)), "binary"),
    "empty.log": (b"", "empty"),
    "blank.log": (b" \n\n\t\r\n  \n" * 1000, "empty"),
    "blank.log.gz": (gzip.compress(b"\n" * 10), "empty"),
    "utf16-no-bom.log": ((FIX / "A_fail.log").read_text().encode("utf-16-le"), "binary"),   # with a BOM it is read
}


@pytest.mark.parametrize("name", sorted(NOT_TEXT))
@pytest.mark.parametrize("scanner", ["auto", "python"])
def test_not_a_text_log(cli, tmp_path, name, scanner):
    data, why = NOT_TEXT[name]
    assert b"\x00" in data or why != "binary" or data[:2] == b"\x1f\x8b"
    p = tmp_path / name
    p.write_bytes(data)
    one_line_error(run(cli, p, "--scanner", scanner), contains=why)


@pytest.mark.parametrize("keep", [0.3, 0.9])
@pytest.mark.parametrize("scanner", ["auto", "python"])
def test_truncated_gzip(cli, tmp_path, keep, scanner):
    data = gzip.compress((FIX / "F1b_fail.log").read_bytes() * 150)
    p = tmp_path / "cut.log.gz"
    p.write_bytes(data[: int(len(data) * keep)])
    one_line_error(run(cli, p, "--scanner", scanner), contains="truncated or corrupt gzip")


@pytest.mark.parametrize("scanner", ["auto", "python"])
def test_fifty_megabyte_single_line_is_a_clean_unknown(cli, tmp_path, scanner):
    """50 MB of printable text and no newline is a (strange) text log: cut at 1 MiB, nothing found."""
    p = tmp_path / "one-line.log"
    chunk = b"INFO 11-29 15:05:31 [api_server.py:1] request ok; tokens=123 status=200 " * 64
    with open(p, "wb") as f:
        for _ in range(50_000_000 // len(chunk) + 1):
            f.write(chunk)
        f.write(b"CUDA out of memory. Tried to allocate 20.00 MiB")     # past the cut: not seen
    r = run(cli, p, "--scanner", scanner)
    assert r.rc == 3 and r.err == ""
    d = r.json()
    assert d["classification"]["class"] == "unknown"
    assert d["source"]["lines"] == 1
    assert any("longer than 1 MiB were cut (first: line 1)" in n for n in d["notes"])


# ----------------------------------------------------------------------------- wrong encodings in a real log
def test_latin1_and_invalid_utf8_mixed_into_a_real_log(cli, tmp_path):
    rnd = random.Random(3)
    out = []
    for ln in (FIX / "A_fail.log").read_bytes().split(b"\n"):
        out.append(ln)
        r = rnd.random()
        if r < 0.3:
            out.append("température élevée, ½ mémoire".encode("latin-1"))
        elif r < 0.6:
            out.append(bytes(rnd.randrange(0x80, 0x100) for _ in range(rnd.randrange(1, 60))))
    p = tmp_path / "mixed.log"
    p.write_bytes(b"\n".join(out))
    for scanner in ("auto", "python"):
        r = run(cli, p, "--scanner", scanner)
        assert r.rc == 0, r.err
        assert r.json()["classification"]["class"] == "kv_capacity"


def test_a_log_saved_as_latin1(cli, tmp_path):
    text = (FIX / "Eserve_pass.log").read_text(encoding="utf-8")
    p = tmp_path / "latin1.log"
    p.write_bytes(text.encode("latin-1", errors="replace"))
    r = run(cli, p)
    assert r.rc == 0 and r.json()["classification"]["class"] == "kv_preemption"


# ----------------------------------------------------------------------------- paths that cannot be read
def test_missing_file(cli, tmp_path):
    one_line_error(run(cli, tmp_path / "nope.log"), contains="no such file")


def test_directory(cli, tmp_path):
    one_line_error(run(cli, tmp_path), contains="directory")


def test_directory_is_refused_with_exit_2(cli, tmp_path):
    """What holds today even with the bug above: exit 2, no traceback."""
    r = run(cli, tmp_path)
    assert r.rc == 2 and "Traceback" not in r.err and "directory" in r.err


@pytest.mark.skipif(IS_ROOT, reason="root reads files whatever their mode")
def test_no_permission(cli, tmp_path):
    p = tmp_path / "secret.log"
    p.write_bytes((FIX / "A_fail.log").read_bytes())
    p.chmod(0)
    try:
        one_line_error(run(cli, p), contains="permission denied")
    finally:
        p.chmod(0o644)


def test_metrics_file_missing(cli, tmp_path):
    one_line_error(run(cli, FIX / "Eserve_pass.log", "--metrics", tmp_path / "nope.txt"), contains="--metrics")


# ----------------------------------------------------------------------------- broken rules
@pytest.fixture
def rules_copy(tmp_path) -> Path:
    dst = tmp_path / "rules"
    for e in sorted(rules_dir().iterdir()):
        if (e / "rules").is_dir():
            shutil.copytree(e / "rules", dst / e.name)
    return dst


BROKEN_RULES = {
    "yaml_syntax": ("vllm/kv_capacity.yaml", "rules:\n  - id: [unclosed\n", "malformed YAML"),
    "engine_yaml_syntax": ("vllm/engine.yaml", "engine: vllm\ncovers: '>=0.11\n", "malformed YAML"),
    "bad_regex": ("vllm/zz_bad_regex.yaml",
                  "id: vllm.bad\nengine: vllm\nrole: root\nclass: runtime_oom\npatterns: ['(unclosed']\n", "invalid regex"),
    "bad_class": ("vllm/zz_bad_class.yaml",
                  "id: vllm.bad\nengine: vllm\nrole: root\nclass: no_such_class\npatterns: ['some text']\n",
                  "not a contract class"),
    "not_utf8": ("vllm/zz_binary.yaml", "\udcff", "cannot be read"),
}


@pytest.mark.parametrize("name", sorted(BROKEN_RULES))
def test_malformed_rules_dir(cli, rules_copy, name):
    rel, text, why = BROKEN_RULES[name]
    (rules_copy / rel).write_bytes(text.encode("utf-8", errors="surrogateescape"))
    one_line_error(run(cli, FIX / "A_fail.log", "--rules", rules_copy), contains=why)


def test_rules_dir_missing(cli, tmp_path):
    one_line_error(run(cli, FIX / "A_fail.log", "--rules", tmp_path / "no-rules"), contains="rules folder not found")


# ----------------------------------------------------------------------------- property tests
@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=4000), gz=st.booleans())
def test_random_bytes_never_crash_the_cli(cli, tmp_path_factory, data, gz):
    p = tmp_path_factory.mktemp("rnd") / "random.log"
    p.write_bytes(gzip.compress(data) if gz else data)
    r = run(cli, p)
    assert r.rc in (2, 3), (r.rc, r.err)
    assert "Traceback" not in r.err
    if r.rc == 2:
        one_line_error(r)
    else:
        assert r.err == "" and r.json()["classification"]["class"] in ("unknown", "not_memory")
    try:
        d = diagnose_file(p, RULES)
    except BadInput:
        return
    assert d.klass in ("unknown", "not_memory")


def _lines(name: str) -> list[bytes]:
    return (FIX / name).read_bytes().rstrip(b"\n").split(b"\n")


A_FAIL = _lines("A_fail.log")
A_ROOT = 57                                  # the first 'ValueError: To serve at least one request' line
assert b"ValueError: To serve at least one request" in A_FAIL[A_ROOT - 1]
# lines of logs without a root failure: mixing them in must not invent one
CLEAN = [ln for name in ("A_pass.log", "B_pass.log", "D_pass.log", "F1b_pass.log", "F2_fail.log", "Eserve_pass.log")
         for ln in _lines(name)]
ALL_REAL = [ln for p in sorted(FIX.glob("*.log")) for ln in p.read_bytes().split(b"\n")]
junk_line = st.one_of(
    st.binary(max_size=120).map(lambda b: b.replace(b"\n", b" ")),
    st.text(max_size=120).map(lambda s: s.replace("\n", " ").encode("utf-8", errors="replace")),
    st.sampled_from([b"\x1b[31mERROR\x1b[0m something", b"Traceback (most recent call last):", b"\r", b"",
                     b"(Worker_TP1 pid=9) INFO 11-29 15:05:31 [custom_all_reduce.py:203] Registering 4563 cuda graph addresses"]),
)


@settings(max_examples=80, deadline=None)
@given(picks=st.lists(st.one_of(st.sampled_from(ALL_REAL), junk_line), max_size=150))
def test_random_mixes_of_real_and_junk_lines_only_raise_bad_input(picks):
    try:
        d = diagnose_lines(enumerate(picks, 1), RULES, SourceInfo("<mix>"))
    except BadInput:
        return
    assert d.klass and d.phase and d.type
    for e in d.evidence:
        assert e["line"] >= 1 and e["line"] <= len(picks)


@settings(max_examples=60, deadline=None)
@given(fill=st.lists(st.lists(st.one_of(st.sampled_from(CLEAN), junk_line), max_size=4),
                     min_size=len(A_FAIL), max_size=len(A_FAIL)))
def test_a_fail_lines_in_order_among_noise_still_classify_kv_capacity(fill):
    mixed: list[bytes] = []
    root_at = None
    for i, ln in enumerate(A_FAIL, 1):
        mixed.extend(fill[i - 1])
        mixed.append(ln)
        if i == A_ROOT:
            root_at = len(mixed)
    d = diagnose_lines(enumerate(mixed, 1), RULES, SourceInfo("<mix>"))
    assert d.klass == "kv_capacity"
    assert d.root is not None and d.root.n == root_at
    assert d.numbers["max_model_len"] == 4_000_000


@settings(max_examples=25, deadline=None)
@given(fill=st.lists(st.one_of(st.sampled_from(CLEAN), junk_line), min_size=0, max_size=40),
       seed=st.integers(min_value=0, max_value=1000))
def test_a_fail_mix_through_the_cli(cli, tmp_path_factory, fill, seed):
    rnd = random.Random(seed)
    mixed = list(A_FAIL)
    for ln in fill:                                      # anywhere, A_fail's own order kept
        mixed.insert(rnd.randrange(len(mixed) + 1), ln)
    p = tmp_path_factory.mktemp("mix") / "mix.log"
    p.write_bytes(b"\n".join(mixed) + b"\n")
    r = run(cli, p)
    if r.rc == 2:                                        # junk at the top can make it look binary
        one_line_error(r, contains="binary")
        return
    assert r.rc == 0, r.err
    assert r.json()["classification"]["class"] == "kv_capacity"
