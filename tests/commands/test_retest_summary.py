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


def test_a_twin_dry_run_does_not_print_an_engine_command(cli, tmp_path):
    """It said "engine mode: twin" and then "dry run: would run .../python -m oomdoctor.retest.engine_runner ..."."""
    card = tmp_path / "a.yaml"
    card.write_bytes((INCIDENTS / "h200-A_fail.yaml").read_bytes())
    before = card.read_bytes()
    # kv_cache_dtype: a lever the real engine never ran on this card (its #1 passed there: the twin answers with that)
    r = cli("retest", card, "--engine", "twin", "--dry-run", "--lever", "kv_cache_dtype")
    assert r.rc == 0, r.err
    assert "engine_runner" not in r.out and "dry run: would run" not in r.out
    assert r.out.strip() == "dry run: the twin engine (the memory model) would predict this change; no engine would run"
    assert card.read_bytes() == before
    proven = cli("retest", card, "--engine", "twin", "--dry-run")
    assert proven.rc == 0 and "attempt 2 ran this configuration on the real engine (pass" in proven.err
    assert proven.out.strip() == ("dry run: attempt 2 already ran this configuration on the real engine (pass); "
                                  "the twin would predict nothing")
    assert card.read_bytes() == before
    real = cli("retest", card, "--engine", "real", "--dry-run")
    assert real.rc == 0 and real.out.startswith("dry run: would run ") and "engine_runner" in real.out


def test_quiet_json_leaves_stderr_empty_and_stdout_one_json_document(cli, tmp_path):
    """An operator's script reads the attempt from stdout; --quiet drops the progress and the summary on stderr."""
    import json

    card = tmp_path / "a.yaml"
    card.write_bytes((INCIDENTS / "h200-A_fail.yaml").read_bytes())
    loud = cli("retest", card, "--engine", "twin", "--json", "--lever", "kv_cache_dtype")
    assert loud.err.strip()                              # without --quiet: the summary of the attempts
    card.write_bytes((INCIDENTS / "h200-A_fail.yaml").read_bytes())
    r = cli("retest", card, "--engine", "twin", "--json", "--quiet", "--lever", "kv_cache_dtype")
    assert r.rc == loud.rc and r.err == ""
    attempt = json.loads(r.out)
    assert attempt["engine"]["mode"] == "twin" and attempt["lever"] == json.loads(loud.out)["lever"]
