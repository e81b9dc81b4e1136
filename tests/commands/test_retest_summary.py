"""The attempts summary `retest` prints: at 80 columns no value is cut or wrapped (the old table printed
"199884…" for max_model_len 1998848)."""
from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.card import store as cardmod
from oomdoctor.commands.retest import print_summary

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"


@pytest.mark.parametrize("card", sorted(INCIDENTS.glob("h200-*.yaml")), ids=lambda p: p.name)
def test_attempts_summary_keeps_every_value_whole(card, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    c = cardmod.load_dict(card)
    print_summary(c)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0].startswith(f"Attempts on {c['id']}")
    assert all(len(ln) <= 80 for ln in lines), err
    assert "…" not in err
    for a in c["attempts"]:
        for v in a.get("change", {}).values():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                assert any(f": {v}" in ln for ln in lines), (v, err)
