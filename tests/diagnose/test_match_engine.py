"""The shape cache of match.LineMatcher gives exactly what the full matcher gives on every line: the same
matches, detection counts, versions, runtime summary (timeline samples included) and hits — on the real
fixtures, on stats-heavy serving lines of many shapes, and on lines whose digits were changed at random.
And it is really used: a stats-heavy stream takes the full matcher once per shape, not once per line."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oomdoctor.diagnose import match as matching
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules
from oomdoctor.diagnose.rulespec import EngineSpec
from oomdoctor.diagnose.shapes import HEX_RUN, digit_uniform, fixed_in_key, mask
from oomdoctor.diagnose.signals import MAX_SAMPLES, RuntimeTracker

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
FIX = LOGS / "vllm-0.25.1-h200"
RULES = default_rules()
ENGINES = list(RULES.engines.values())


def _result(lm: matching.LineMatcher, rt: RuntimeTracker, hits: dict):
    rt.select(lambda engine, versions: True)
    return ([(m.rule.id, m.n, m.line.msg, m.numbers, m.groups) for m in lm.matches], lm.counts, lm.versions,
            rt.summary(), hits)


def full(lines):
    """The reference: every line through the full matcher."""
    rt, hits = RuntimeTracker(), {}
    lm = matching.LineMatcher(RULES.rules, ENGINES, rt, hits)
    for n, raw in lines:
        lm.add(n, raw)
    return _result(lm, rt, hits)


def cached(lines, batch=None):
    rt, hits = RuntimeTracker(), {}
    lm = matching.LineMatcher(RULES.rules, ENGINES, rt, hits)
    lines = list(lines)
    step = batch or len(lines) or 1
    for i in range(0, len(lines), step):
        lm.add_pairs(lines[i:i + step])
    return _result(lm, rt, hits), lm


def block_fed(lines):
    """As diagnose feeds grep's output: blocks of N:line records."""
    rt, hits = RuntimeTracker(), {}
    lm = matching.LineMatcher(RULES.rules, ENGINES, rt, hits)
    recs = [b"%d:%s" % (n, raw) for n, raw in lines]
    for i in range(0, len(recs), 777):
        lm.add_block(b"\n".join(recs[i:i + 777]))
    return _result(lm, rt, hits)


def candidate_lines(path: Path) -> list[tuple[int, bytes]]:
    return [(n, ln.rstrip(b"\r")) for n, ln in enumerate(path.read_bytes().split(b"\n"), 1) if ln]


@pytest.mark.parametrize("rel", sorted(p.relative_to(LOGS).as_posix() for p in LOGS.rglob("*.log")))
def test_every_fixture_same_as_the_full_matcher(rel):
    lines = candidate_lines(LOGS / rel)
    ref = full(lines)
    assert cached(lines)[0] == ref
    assert cached(lines, batch=7)[0] == ref


STATS = (b"(APIServer pid=4392) INFO 11-29 %02d:%02d:%02d [loggers.py:273] Engine 000: Avg prompt throughput: %.1f "
         b"tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, %s"
         b"GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%")
REJECT = (b"(APIServer pid=4392) ERROR 11-29 %02d:%02d:%02d [serving.py:1] This model's maximum context length is "
          b"%d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.")
ACCESS = b'(APIServer pid=4392) INFO:     127.0.0.1:%d - "POST /v1/completions HTTP/1.1" 200 OK'


def serving_lines(n_lines: int, seed: int) -> list[tuple[int, bytes]]:
    """A serving log's candidate lines: stats lines of many shapes (numbers of every width, with and without
    the 0.25 'Preemptions: N' field, KV pressure now and then), rejected requests, the real start-up."""
    rnd = random.Random(seed)
    out = candidate_lines(FIX / "Eserve_pass.log")[:120]
    n = out[-1][0]
    for i in range(n_lines):
        n += rnd.randint(1, 3)
        s = i * 10
        if rnd.random() < 0.05:
            out.append((n, REJECT % (s // 3600 % 24, s // 60 % 60, s % 60, 32768, rnd.randint(32769, 99999))))
            continue
        pre = b"Preemptions: %d, " % rnd.randint(1, 40) if rnd.random() < 0.1 else b""
        hot = rnd.random() < 0.1
        out.append((n, STATS % (s // 3600 % 24, s // 60 % 60, s % 60, rnd.uniform(0, 99999), rnd.uniform(0, 9999),
                                rnd.randint(0, 300), rnd.randint(1, 400) if hot else rnd.choice((0, 0, 1)), pre,
                                rnd.uniform(95, 100) if hot else rnd.uniform(0, 99.9), rnd.uniform(0, 100))))
    return out


def test_stats_heavy_lines_same_as_the_full_matcher_and_once_per_shape():
    lines = serving_lines(3 * MAX_SAMPLES, seed=1)          # past MAX_SAMPLES: the timeline's stride doubles
    ref = full(lines)
    got, lm = cached(lines, batch=1000)
    assert got == ref
    assert block_fed(lines) == ref
    summary = ref[3]
    assert summary["stats_lines"] > 2 * MAX_SAMPLES and summary["kv_pressure_samples"] > 100
    assert summary["preemptions"] > 0 and summary["rejected_requests"] > 20
    shapes = {mask(b"%d:%s" % (n, raw)) for n, raw in lines}
    slow = [p for p in lm._plans.values() if p.pending is None]
    hex_plans = [h for hs in lm._hex.values() for h in hs if h.ok]  # a start-up line with a cache path's hash in it
    assert len(lm._plans) + len(hex_plans) == len(shapes) < len(lines) // 4
    assert len(slow) < len(lm._plans) // 2           # the stats and rejection shapes are fast


@pytest.mark.parametrize("prefix", [b"api-1  | ", b"nemo-run-0/0 ", b"2026-03-04T18:02:11.408Z ", b"[default0]:"])
def test_stats_lines_behind_a_wrapper_prefix_same_as_the_full_matcher(prefix):
    """The fast path takes a stats line's time stamp where parse_line does, behind a launcher's prefix too."""
    lines = [(n, prefix + raw) for n, raw in serving_lines(MAX_SAMPLES // 2, seed=4)]
    ref = full(lines)
    assert cached(lines, batch=500)[0] == ref and block_fed(lines) == ref
    stamps = [s["ts"] for s in ref[3]["timeline"]]
    assert len(stamps) > 100 and all(stamps)


def test_full_matcher_runs_once_per_shape(monkeypatch):
    lines = [(n, raw) for n, raw in serving_lines(2000, seed=2) if b"Engine 000" in raw]
    calls = []
    orig = matching.LineMatcher._match
    monkeypatch.setattr(matching.LineMatcher, "_match", lambda self, n, raw: calls.append(n) or orig(self, n, raw))
    _, lm = cached(lines)
    assert len(calls) == len({mask(b"%d:%s" % (n, raw)) for n, raw in lines}) < len(lines) // 3


def _mutate(line: bytes, rnd: random.Random) -> bytes:
    return re.sub(rb"\d", lambda m: str(rnd.randint(0, 9)).encode(), line)


ALL = [raw for p in sorted(FIX.glob("*.log")) for _, raw in candidate_lines(p)]


@settings(max_examples=40, deadline=None)
@given(picks=st.lists(st.integers(min_value=0, max_value=len(ALL) - 1), min_size=1, max_size=30),
       repeat=st.integers(min_value=1, max_value=30), seed=st.integers(min_value=0, max_value=2**16))
def test_lines_with_other_digits_same_as_the_full_matcher(picks, repeat, seed):
    """Same-shape lines (only digits changed) repeated: a config line 'utilization ... 1.0. Got 1.5' whose
    regex tests a literal digit, version lines, numbers that overflow a width — the cache must never differ."""
    rnd = random.Random(seed)
    lines = [(n, _mutate(ALL[picks[n % len(picks)]], rnd)) for n in range(1, len(picks) * repeat + 1)]
    assert cached(lines, batch=13)[0] == full(lines)


def test_digit_uniform_regexes():
    assert digit_uniform(r"Running: (?P<r>\d+) reqs, .*?GPU KV cache usage: (?P<kv>\d+(?:\.\d+)?)%")
    assert digit_uniform(r"[^0-9]+[\w.]+\s\S{3}")
    assert not digit_uniform(r"must be less than 1\.0")          # a literal digit
    assert not digit_uniform(r"Waiting: [1-9]\d*")               # a class with some digits
    assert not digit_uniform(r"(?P<a>\d+) == (?P=a)")            # a backreference compares the digits
    assert not digit_uniform(r"[^0]")


@pytest.mark.slow
def test_diagnose_of_a_stats_heavy_log_grep_and_python_agree(tmp_path):
    lines = serving_lines(2 * MAX_SAMPLES, seed=3)
    log = tmp_path / "serve.log"
    body, last = [], 0
    for n, raw in lines:
        body.extend([ACCESS % (30000 + k) for k in range(n - last - 1)])
        body.append(raw)
        last = n
    log.write_bytes(b"\n".join(body) + b"\n")
    g, p = diagnose_file(log, RULES, scanner="auto"), diagnose_file(log, RULES, scanner="python")
    assert (g.klass, g.rule, g.numbers, g.runtime, g.hits) == (p.klass, p.rule, p.numbers, p.runtime, p.hits)
    assert g.klass == "kv_preemption" and g.runtime["stats_lines"] == sum(b"Engine 000" in r for _, r in lines)


# ----------------------------------------------------------------------------- request ids (hex keys)
ADDED = b"(APIServer pid=4392) INFO 11-29 %02d:%02d:%02d [async_llm.py:343] Added request %s-%s-0."
RECEIVED = b"(APIServer pid=4392) INFO 11-29 %02d:%02d:%02d [logger.py:49] Received request %s-%s: prompt: 'x'"


def _hex_id(rnd: random.Random, planted: list[bytes]) -> bytes:
    """A request id: 32 hex digits, a UUID, or (now and then) one with a literal of the matcher planted in it."""
    r = rnd.random()
    if r < 0.1:
        return b"%08x-%04x-%04x-%04x-%012x" % tuple(rnd.getrandbits(b) for b in (32, 16, 16, 16, 48))
    h = b"%032x" % rnd.getrandbits(128)
    if r < 0.25 and planted:
        lit = rnd.choice(planted)
        at = rnd.randint(0, len(h) - len(lit))
        h = h[:at] + lit + h[at + len(lit):]
    return h[:rnd.choice((16, 24, 32, 32, 32))]


def request_lines(n_lines: int, seed: int, planted: list[bytes]) -> list[tuple[int, bytes]]:
    """The candidate lines of a serving log that logs its requests: start-up, stats lines, and 'Added request'
    lines, each with a new id (of several kinds and widths, some holding a literal the matcher looks for)."""
    rnd = random.Random(seed)
    out = candidate_lines(FIX / "Eserve_pass.log")[:120]
    stats = serving_lines(n_lines // 4, seed)[120:]
    n = out[-1][0]
    for i in range(n_lines):
        n += 1
        s = i * 3
        if i % 4 == 0 and stats:
            out.append((n, stats.pop()[1]))
            continue
        kind = rnd.choice((b"cmpl", b"chatcmpl", b"embd", b"req", b"xyz"))
        fmt = ADDED if rnd.random() < 0.9 else RECEIVED
        out.append((n, fmt % (s // 3600 % 24, s // 60 % 60, s % 60, kind, _hex_id(rnd, planted))))
    return out


def _matcher_calls(monkeypatch) -> list[bytes | str]:
    calls: list[bytes | str] = []
    orig = matching.LineMatcher._match
    monkeypatch.setattr(matching.LineMatcher, "_match", lambda self, n, raw: calls.append(raw) or orig(self, n, raw))
    return calls


def test_request_ids_same_as_the_full_matcher_and_not_once_per_line(monkeypatch):
    planted = [b"dead", b"Added request ", b"beef", b"0.25.1"]
    lines = request_lines(6000, seed=4, planted=planted)
    ref = full(lines)
    calls = _matcher_calls(monkeypatch)
    got, lm = cached(lines, batch=500)
    learned = sum(b"Added request" in raw for raw in calls)
    assert got == ref and block_fed(lines) == ref
    added = sum(b"Added request" in raw for _, raw in lines)
    assert added > 4000 and ref[4]["vllm.serving.request"]["count"] == 1     # the first line is the evidence
    assert learned < added // 10                         # request lines take their hex key's plan
    assert len(lm._plans) < 1000                         # and leave no shape behind each


def test_hex_literals_of_an_engine_are_counted_as_the_full_matcher_counts():
    """An engine whose detection strings are hex digits ('deadbeef', 'c0ffee1234') or touch a run: lines whose id
    holds them (or not) count alike on both paths — a key holding such a literal gets no hex plan."""
    odd = EngineSpec("oddengine", "odd", None, ["deadbeef", "c0ffee1234", "-0.", "pl-f"], [], [], "-")
    engines = ENGINES + [odd]
    lines = request_lines(3000, seed=5, planted=[b"deadbeef", b"c0ffee1234"])

    def run(feed):
        rt, hits = RuntimeTracker(), {}
        lm = matching.LineMatcher(RULES.rules, engines, rt, hits)
        feed(lm)
        return _result(lm, rt, hits)

    def one_by_one(lm):
        for n, raw in lines:
            lm.add(n, raw)

    ref = run(one_by_one)
    assert ref[1]["oddengine"] > 0
    assert run(lambda lm: lm.add_pairs(lines)) == ref


def test_fixed_in_key():
    key = mask(b"7:(APIServer pid=1) INFO 11-29 01:02:03 [async_llm.py:343] Added request cmpl-%s-0." % (b"ab" * 16))
    runs = [m.span() for m in HEX_RUN.finditer(key)]
    assert len(runs) == 1 and not HEX_RUN.search(mask(b"1:no run here: cafe-bad-c0ffee"))
    assert fixed_in_key(b"Added request ", key, runs)
    assert fixed_in_key(b"(APIServer pid=", key, runs)
    assert fixed_in_key(b"not in it", key, runs)
    assert not fixed_in_key(b"beef", key, runs)          # could lie inside another line's id
    assert not fixed_in_key(b"cmpl-a", key, runs)        # could start another line's id
    assert not fixed_in_key(b"f-0.", key, runs)          # could end it
    assert fixed_in_key(b"q-0.", key, runs)              # 'q' is no hex digit: cannot end an id
    assert not fixed_in_key(b"pid=1", key, runs)         # holds a digit that is in the key


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**16), n=st.integers(min_value=1, max_value=400))
def test_request_ids_any_seed_same_as_the_full_matcher(seed, n):
    lines = request_lines(n, seed=seed, planted=[b"dead", b"Added request ", b"Running: ", b"1.1"])
    assert cached(lines, batch=37)[0] == full(lines)


@pytest.mark.slow
def test_diagnose_with_request_ids_same_with_and_without_the_cache(tmp_path, monkeypatch):
    lines = request_lines(20000, seed=6, planted=[b"dead"])
    log = tmp_path / "requests.log"
    log.write_bytes(b"\n".join(raw for _, raw in lines) + b"\n")

    def facts(d):
        return (d.klass, d.rule, d.phase, d.phase_basis, d.engine, d.engine_version, d.numbers, d.runtime,
                d.evidence, d.notes, d.hits)

    g, p = diagnose_file(log, RULES, scanner="auto"), diagnose_file(log, RULES, scanner="python")
    orig = matching.LineMatcher.__init__

    def no_cache(self, *a, **k):
        orig(self, *a, **k)
        self._cache = False
    monkeypatch.setattr(matching.LineMatcher, "__init__", no_cache)
    slow = diagnose_file(log, RULES, scanner="auto")
    assert facts(g) == facts(p) == facts(slow)
    assert g.runtime["stats_lines"] > 1000


@settings(max_examples=60, deadline=None)
@given(ints=st.integers(min_value=1, max_value=4), decimals=st.integers(min_value=0, max_value=14),
       values=st.lists(st.floats(min_value=0, max_value=9999, allow_nan=False), min_size=1, max_size=30))
def test_pressure_threshold_compared_as_bytes_is_the_float_comparison(ints, decimals, values):
    """The bulk fold compares a shape's KV numbers as bytes against 95 written the same way: the same answer as
    float() of each, or no bytes threshold at all (then it converts)."""
    from types import SimpleNamespace

    from oomdoctor.diagnose.shapes import NumberSlot
    from oomdoctor.diagnose.signals import KV_PRESSURE_PERCENT, _Lazy

    width = ints + (decimals + 1 if decimals else 0)
    raws = [(f"{v:.{decimals}f}" if decimals else f"{v:.0f}").zfill(width).encode() for v in values]
    raws = [r for r in raws if len(r) == width]
    if not raws:
        return
    slot = SimpleNamespace(numbers=[NumberSlot("kv_usage_percent", 0, width, "percent", True)])
    lazy = _Lazy(slot, raws, 0, "kv_usage_percent")
    at = lazy.as_bytes(KV_PRESSURE_PERCENT)
    if at is not None:
        assert [r >= at for r in raws] == [float(r) >= KV_PRESSURE_PERCENT for r in raws]
    else:
        assert ints < 2 or decimals > 12
