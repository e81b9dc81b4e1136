"""Optional extras fail soft: without matplotlib, `--plot` costs one line on stderr and the result is still printed
(with its own exit code); the card is still written."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-0.25.1-h200"


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib → ImportError


def test_diagnose_plot_without_matplotlib_still_diagnoses(cli, tmp_path, no_matplotlib):
    r = cli("diagnose", FIX / "E_pass.log", "--no-device", "--out", tmp_path / "e.yaml", "--plot", tmp_path / "e.png")
    assert r.rc == 0
    assert r.out.startswith("kv_preemption · phase runtime")
    assert r.err_lines == ["oomdoctor: warning: --plot needs matplotlib: pip install 'oomdoctor[plot]'; "
                           "the diagnosis is complete without the plot"]
    assert (tmp_path / "e.yaml").is_file() and not (tmp_path / "e.png").exists()


def test_diagnose_plot_of_a_log_without_stats_is_still_bad_input(cli, tmp_path):
    r = cli("diagnose", FIX / "A_fail.log", "--no-device", "--no-card", "--plot", tmp_path / "a.png")
    assert r.rc == 2 and r.err.startswith("oomdoctor: error: --plot: ") and len(r.err_lines) == 1


def test_compare_plot_without_matplotlib_still_compares(cli, tmp_path, no_matplotlib):
    r = cli("compare", FIX / "D_pass.log", FIX / "D_fail.log", "--json", "--plot", tmp_path / "c.png")
    assert r.rc == 0
    assert "ledger" in r.json() and "plot" not in r.json()
    assert len(r.err_lines) == 1 and r.err.startswith("oomdoctor: warning: --plot needs matplotlib")
