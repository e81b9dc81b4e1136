"""retest end to end on the CPU with a fake engine process tree that replays real vLLM 0.25.1 logs:
the attempt is recorded atomically, the next lever is proposed, and a killed retest (SIGINT, SIGTERM,
timeout) leaves no process alive and no half-written card."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from oomdoctor.card import store as cardmod
from oomdoctor.errors import CardError

ROOT = Path(__file__).resolve().parents[2]
FX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
FAKE = ROOT / "tests" / "fake_engine.py"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ, OOMDOCTOR_NO_NVML="1", PYTHONPATH=str(ROOT))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "oomdoctor", *args], capture_output=True, text=True, env=e, cwd=ROOT, timeout=120)


def make_card(tmp_path: Path, hang: bool = False) -> tuple[Path, Path]:
    card = tmp_path / "a.yaml"
    r = run_cli("diagnose", str(FX / "A_fail.log"), "--out", str(card), "--no-device", "--json")
    assert r.returncode == 0, r.stderr
    d = yaml.safe_load(card.read_text())
    pids = tmp_path / "pids.txt"
    argv = [sys.executable, str(FAKE), "--pids", str(pids), "--fail-log", str(FX / "A_fail.log"),
            "--pass-log", str(FX / "A_pass.log"), "--threshold", "2000000"]
    if hang:
        argv.append("--hang")
    d["workload"].update(launcher="command", argv=argv, engine_args={}, base_args={})
    d["workload"].pop("free_at_start_bytes", None)
    cardmod.save(d, card)
    return card, pids


def pids_alive(pids: Path) -> list[int]:
    alive = []
    for p in (int(x) for x in pids.read_text().split()):
        try:
            os.kill(p, 0)
        except ProcessLookupError:
            continue
        # a zombie is dead for our purpose (it holds no memory); check /proc state
        try:
            state = Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(p)
    return alive


@pytest.mark.slow
def test_first_lever_passes_and_is_recorded(tmp_path: Path) -> None:
    card, pids = make_card(tmp_path)
    before = cardmod.load_dict(card)
    assert before["levers"][0]["id"] == "max_model_len"
    r = run_cli("retest", str(card), "--engine", "real", "--trust-card", "--json")
    assert r.returncode == 0, r.stderr
    after = cardmod.load_dict(card)
    a = after["attempts"][-1]
    assert a["lever"] == "max_model_len" and a["outcome"] == "pass"
    assert a["signature_gone"] is True and a["served"] is True
    assert a["classification"]["class"] == "unknown"       # the new log is a clean start
    assert a["config_fingerprint"].startswith("sha256:")
    assert (card.parent / a["log_path"]).exists()
    assert not pids_alive(pids)


@pytest.mark.slow
def test_reproduce_then_fail_proposes_next_lever(tmp_path: Path) -> None:
    card, pids = make_card(tmp_path)
    r = run_cli("retest", str(card), "--engine", "real", "--trust-card", "--lever", "none")
    assert r.returncode == 1
    a = cardmod.load_dict(card)["attempts"][-1]
    assert a["outcome"] == "fail" and a["signature_gone"] is False
    assert a["classification"]["class"] == "kv_capacity"
    # a second attempt keeps the first one
    r = run_cli("retest", str(card), "--engine", "real", "--trust-card")
    assert r.returncode == 0
    atts = cardmod.load_dict(card)["attempts"]
    assert [x["n"] for x in atts] == [1, 2] and atts[0]["lever"] == "none"
    assert not pids_alive(pids)


@pytest.mark.slow
def test_failed_lever_records_next(tmp_path: Path) -> None:
    card, pids = make_card(tmp_path)
    d = cardmod.load_dict(card)
    # force a lever that cannot work for the fake engine (window above its threshold)
    d["levers"][0]["change"] = {"max_model_len": 3000000}
    cardmod.save(d, card)
    r = run_cli("retest", str(card), "--engine", "real", "--trust-card")
    assert r.returncode == 1
    after = cardmod.load_dict(card)
    a = after["attempts"][-1]
    assert a["outcome"] == "fail" and a["next_lever"] is not None
    assert a["next_lever"]["id"] != "max_model_len" or a["next_lever"]["change"] != {"max_model_len": 3000000}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_killed_retest_leaves_no_process_and_no_half_card(tmp_path: Path, sig: int) -> None:
    card, pids = make_card(tmp_path, hang=True)
    text_before = card.read_text()
    e = dict(os.environ, OOMDOCTOR_NO_NVML="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "oomdoctor", "retest", str(card), "--engine", "real", "--trust-card"],
                            cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.time() - t0 < 30:
        time.sleep(0.1)
    assert pids.exists(), "the fake engine did not start"
    time.sleep(0.5)
    assert pids_alive(pids), "the fake engine tree should be running"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in err
    time.sleep(0.5)
    assert not pids_alive(pids)
    assert card.read_text() == text_before            # no attempt half-written
    cardmod.load_dict(card)
    assert not list(card.parent.glob(".a.yaml.*.tmp"))


@pytest.mark.slow
def test_timeout_ends_the_group(tmp_path: Path) -> None:
    card, pids = make_card(tmp_path, hang=True)
    r = run_cli("retest", str(card), "--engine", "real", "--trust-card", "--timeout", "4")
    assert r.returncode == 1
    a = cardmod.load_dict(card)["attempts"][-1]
    assert a["outcome"] == "timeout"
    assert not pids_alive(pids)


@pytest.mark.slow
def test_twin_is_labelled_a_prediction(tmp_path: Path) -> None:
    card, _ = make_card(tmp_path)
    r = run_cli("retest", str(card), "--engine", "twin")
    assert r.returncode == 4                          # a prediction: never the exit code of a real pass
    a = cardmod.load_dict(card)["attempts"][-1]
    assert a["engine"]["mode"] == "twin" and a["outcome"] == "predicted_pass"
    assert any("PREDICTION" in n for n in a["notes"])


@pytest.mark.slow
def test_twin_does_not_re_predict_what_the_real_engine_ran(tmp_path: Path) -> None:
    # the real engine passed lever #1; a twin of the same configuration answers with that run and appends nothing
    card, _ = make_card(tmp_path)
    assert run_cli("retest", str(card), "--engine", "real", "--trust-card").returncode == 0
    text = card.read_text()
    r = run_cli("retest", str(card), "--engine", "twin", "--json")
    assert r.returncode == 0, r.stderr                # the real run's verdict, not a prediction's 4
    assert "attempt 1 ran this configuration on the real engine (pass" in r.stderr and "nothing appended" in r.stderr
    shown = json.loads(r.stdout)
    assert shown["n"] == 1 and shown["engine"]["mode"] == "real" and shown["twin_not_run"] is True
    assert card.read_text() == text
    # another configuration (the next lever) is still predicted
    r = run_cli("retest", str(card), "--engine", "twin", "--lever", "kv_cache_dtype")
    assert r.returncode == 4 and cardmod.load_dict(card)["attempts"][-1]["engine"]["mode"] == "twin"


@pytest.mark.slow
def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    card, pids = make_card(tmp_path)
    text = card.read_text()
    r = run_cli("retest", str(card), "--dry-run")
    assert r.returncode == 0
    assert "--max-model-len" in r.stdout
    assert card.read_text() == text and not pids.exists()


@pytest.mark.slow
def test_card_from_another_version_or_edited_badly_is_refused(tmp_path: Path) -> None:
    card, _ = make_card(tmp_path)
    d = yaml.safe_load(card.read_text())
    d["schema"] = "oomdoctor.incident/v0"
    bad = tmp_path / "old.yaml"
    bad.write_text(yaml.safe_dump(d))
    r = run_cli("retest", str(bad), "--dry-run")
    assert r.returncode == 2 and "field 'schema'" in r.stderr and "Traceback" not in r.stderr
    d = yaml.safe_load(card.read_text())
    d["levers"][0]["id"] = "more_memory_please"
    bad.write_text(yaml.safe_dump(d))
    r = run_cli("retest", str(bad), "--dry-run")
    assert r.returncode == 2 and "levers[0].id" in r.stderr
    d = yaml.safe_load(card.read_text())
    d["classification"]["class"] = "oom"
    with pytest.raises(CardError, match="classification.class"):
        cardmod.check(d, "x")


@pytest.mark.slow
def test_unappliable_lever_is_refused(tmp_path: Path) -> None:
    card, _ = make_card(tmp_path)
    r = run_cli("retest", str(card), "--lever", "larger_gpu", "--dry-run")
    assert r.returncode == 2 and "larger_gpu" in r.stderr
