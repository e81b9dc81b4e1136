"""The KV timeline, from the runtime summary of a REAL vLLM 0.25.1 serving log (Eserve_pass.log:
64 long prompts through `vllm serve` on a 2.5e9-byte KV arena on an H200; see fixtures/logs/.../ORIGIN.md)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.errors import BadInput
from oomdoctor.diagnose.rules import load_rules
from oomdoctor.paths import rules_dir
from oomdoctor.analysis.timeline import episodes, plot, render_text

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200" / "Eserve_pass.log"


@pytest.fixture(scope="module")
def summary() -> dict:
    return diagnose_file(LOG, load_rules(rules_dir())).runtime


def test_summary_is_the_real_one(summary):
    tl = summary["timeline"]
    assert [s["line"] for s in tl] == [97, 109, 121, 129, 141, 148, 160, 163]
    assert [s["waiting"] for s in tl] == [52, 41, 30, 23, 12, 7, 0, 0]
    assert [s["kv_usage_percent"] for s in tl] == [99.5, 98.2, 95.5, 99.0, 97.2, 85.4, 16.4, 0.0]


def test_one_episode_covers_the_saturated_lines(summary):
    eps = episodes(summary)
    assert len(eps) == 1
    e = eps[0]
    # KV 95.5-99.5 % while 52 → 12 requests waited (lines 97-141). Line 148 (85.4 %, 7 waiting) still
    # has a queue but KV is under 95 %: by the definition it ends the episode.
    assert (e["start_line"], e["end_line"]) == (97, 141)
    assert (e["start_ts"], e["end_ts"]) == ("11-29 15:19:01", "11-29 15:19:09")
    assert e["samples"] == 5 and e["peak_waiting"] == 52
    assert (e["waiting_start"], e["waiting_end"]) == (52, 12)
    assert (e["min_kv_usage_percent"], e["peak_kv_usage_percent"]) == (95.5, 99.5)
    assert e["samples"] == summary["kv_pressure_samples"]


def test_render_text(summary):
    txt = render_text(summary)
    assert "peak 99.5% at line 97 (11-29 15:19:01)" in txt
    assert "peak 52 waiting at line 97" in txt
    assert "episode 1: lines 97-141" in txt and "waiting 52 → 12" in txt
    rows = {ln.split("|")[0].strip(): ln.split("|")[1] for ln in txt.splitlines() if ln.count("|") == 2}
    assert set(rows) == {"KV usage", "waiting", "running", "pressure", "preempt"}
    assert all(len(r) == 8 for r in rows.values())                  # one column per sample
    assert rows["pressure"] == "^^^^^   "
    assert rows["KV usage"][0] == "█" and rows["KV usage"][-1] == " "
    assert rows["waiting"][0] == "█" and rows["waiting"][-2:] == "  "
    assert "0 preemption(s)" in txt
    assert render_text(summary, ascii=True).isascii()


def test_long_timelines_are_bucketed():
    tl = [{"line": i, "ts": None, "kv_usage_percent": 99.0 if 100 <= i < 200 else 10.0, "running": 4,
           "waiting": 3 if 100 <= i < 200 else 0, "preemptions": 1 if i == 150 else None} for i in range(1000)]
    s = {"timeline": tl, "preemptions": 1, "preemptions_source": "log"}
    txt = render_text(s, width=50)
    rows = {ln.split("|")[0].strip(): ln.split("|")[1] for ln in txt.splitlines() if ln.count("|") == 2}
    assert all(len(r) == 50 for r in rows.values())
    assert rows["pressure"] == " " * 5 + "^" * 5 + " " * 40
    assert rows["preempt"].strip() == "P" and rows["preempt"].index("P") == 7
    assert "20.0 samples per column" in txt
    [e] = episodes(s)
    assert (e["start_line"], e["end_line"], e["samples"], e["preemptions"]) == (100, 199, 100, 1)


def test_preemptions_without_time_are_said_not_placed():
    s = {"timeline": [{"line": 1, "ts": "x", "kv_usage_percent": 50.0, "running": 1, "waiting": 0, "preemptions": None}],
         "preemptions": 15, "preemptions_source": "metrics"}
    assert "15 preemption(s) (source: metrics); the count has no time" in render_text(s)
    assert episodes(s) == []


def test_empty_and_bad_summaries():
    assert "no stats lines" in render_text({})
    assert "no stats lines" in render_text(None)
    assert episodes({}) == []
    with pytest.raises(BadInput):
        render_text({"timeline": "nope"})
    with pytest.raises(BadInput):
        render_text({"timeline": []}, width=3)
    with pytest.raises(BadInput, match="nothing to plot"):
        plot({}, "x.png")


HAS_MPL = importlib.util.find_spec("matplotlib") is not None


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib is not installed (optional extra 'plot')")
def test_plot_writes_a_png(summary, tmp_path):
    out = plot(summary, tmp_path / "kv.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


@pytest.mark.skipif(HAS_MPL, reason="matplotlib is installed")
def test_plot_without_matplotlib_says_how_to_get_it(summary, tmp_path):
    with pytest.raises(BadInput, match=r"--plot needs matplotlib: pip install 'oomdoctor\[plot\]'"):
        plot(summary, tmp_path / "kv.png")
