"""Fuzz targets (hypothesis, bounded: OOMDOCTOR_FUZZ_EXAMPLES examples each, 40 by default, so the README's test
command runs them in CI in seconds) over what strangers hand oomdoctor: log bytes (framed as UTF-16, gzip members,
NULs and real lines), cards (a real card with its values replaced, nested or aliased), project files and profile
documents. Whatever the input, the answer is a result or one ``BadInput`` — exit 2 with one line — never another
exception; and redaction never raises and is stable."""
from __future__ import annotations

import gzip
import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, ROOT, invoke
from oomdoctor.card import store
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules
from oomdoctor.errors import BadInput
from oomdoctor.redact import redact_obj, redact_text

N = int(os.environ.get("OOMDOCTOR_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=N, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                     HealthCheck.too_slow])
RULES = default_rules()
REAL_LINES = [ln for p in sorted(FIXTURES.glob("*.log")) for ln in p.read_bytes().split(b"\n")][:4000]
CARD = yaml.safe_load((ROOT / "incidents" / "h200-A_fail.yaml").read_text())

scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 50), max_value=10 ** 50),
                   st.floats(allow_nan=True), st.text(max_size=40))
value = st.recursive(scalar, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                     st.dictionaries(st.text(max_size=12), kids, max_size=4)),
                     max_leaves=30)
line = st.one_of(st.sampled_from(REAL_LINES), st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")))


@st.composite
def log_bytes(draw) -> bytes:
    body = b"\n".join(draw(st.lists(line, max_size=60)))
    frame = draw(st.sampled_from(["plain", "utf16", "gzip", "gzip-members", "nul"]))
    if frame == "utf16":
        return body.decode("utf-8", errors="replace").encode("utf-16")
    if frame == "gzip":
        return gzip.compress(body)
    if frame == "gzip-members":
        cut = draw(st.integers(min_value=0, max_value=len(body)))
        return gzip.compress(body[:cut]) + gzip.compress(body[cut:]) + b"\x00" * draw(st.integers(0, 8))
    if frame == "nul":
        at = draw(st.integers(min_value=0, max_value=len(body)))
        return body[:at] + b"\x00" + body[at:]
    return body


def _one_line_or_ok(r) -> None:
    assert "Traceback" not in r.err and "internal error" not in r.err, r.err
    if r.rc == 2:
        assert len(r.err.splitlines()) == 1 and r.err.startswith("oomdoctor: error:"), r.err


@FUZZ
@given(data=log_bytes())
def test_fuzz_log_bytes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("fz") / "fuzz.log"
    p.write_bytes(data)
    try:
        d = diagnose_file(p, RULES, scanner="python")
    except BadInput:
        return
    assert d.klass
    r = invoke("diagnose", p, "--no-device", "--no-card", "--json")
    assert r.rc in (0, 2, 3)
    _one_line_or_ok(r)


@st.composite
def card_text(draw) -> str:
    d = dict(CARD)
    for key in draw(st.lists(st.sampled_from(sorted(CARD)), max_size=3)):
        d[key] = draw(value)
    text = yaml.safe_dump(d, sort_keys=False)
    shape = draw(st.sampled_from(["as is", "nested", "aliased", "cut"]))
    if shape == "nested":
        depth = draw(st.integers(1, 400))
        text += "extra: " + "[" * depth + "]" * depth + "\n"
    elif shape == "aliased":
        text += "x0: &x0 [1, 2, 3]\n" + "".join(f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 6)}]\n"
                                                for i in range(1, draw(st.integers(1, 12))))
    elif shape == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    return text


@FUZZ
@given(text=card_text())
def test_fuzz_cards(tmp_path_factory, text):
    p = tmp_path_factory.mktemp("fc") / "card.yaml"
    p.write_text(text)
    try:
        store.load_dict(p)
    except BadInput:
        pass
    _one_line_or_ok(invoke("retest", p, "--dry-run"))


@FUZZ
@given(doc=value, as_json=st.booleans())
def test_fuzz_project_and_profile_documents(tmp_path_factory, doc, as_json):
    from oomdoctor.gate.project import parse_project
    from oomdoctor.profiles.files import read_doc

    d = tmp_path_factory.mktemp("fp")
    text = yaml.safe_dump({"version": 1, "configs": doc}) if not as_json else repr(doc)
    try:
        parse_project(text, ".oomdoctor.yaml", str(d))
    except BadInput:
        pass
    p = d / ("profiles.json" if as_json else "profiles.yaml")
    p.write_text(text)
    try:
        read_doc(p)
    except BadInput:
        pass


@FUZZ
@given(s=st.text(max_size=300), obj=value)
def test_fuzz_redaction_never_raises_and_is_stable(s, obj):
    once = redact_text(s)
    assert redact_text(once) == once
    assert isinstance(redact_obj(obj), type(obj)) or isinstance(obj, tuple)

