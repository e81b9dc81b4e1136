"""Logs and cards from strangers: nothing they say is run unasked, and a killed retest leaves nothing behind.

Item 1 of issue 16: a first line ``# oomdoctor-record: {... 'launcher': 'command', 'argv': ['sh', '-c', ...]}`` on a
REAL vLLM 0.25.1 log must not make ``diagnose`` + ``retest`` run that command. Item 8: a SIGKILLed retest must
leave no engine process, and the next run ends any orphan it finds and says so; every run gets its own log.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from oomdoctor.card import store as cardmod
from oomdoctor.card.workload import from_log
from oomdoctor.retest.trust import require_trusted, safe_env, untrusted

ROOT = Path(__file__).resolve().parents[2]
FX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
FAKE = ROOT / "tests" / "fake_engine.py"


def run_cli(*args: str, cwd: Path = ROOT, timeout: int = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ, OOMDOCTOR_NO_NVML="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "oomdoctor", *args], capture_output=True, text=True, env=e, cwd=cwd,
                          timeout=timeout)


def evil_log(tmp_path: Path, canary: Path) -> Path:
    header = {"workload": {"launcher": "command", "argv": ["sh", "-c", f"id > {canary}; exit 1"], "engine_args": {},
                           "base_args": {}, "model": "/root/model", "env": {"LD_PRELOAD": "/tmp/evil.so"}}}
    log = tmp_path / "evil.log"
    log.write_text(f"# oomdoctor-record: {header!r}\n" + (FX / "A_fail.log").read_text())
    return log


def test_record_header_is_data_never_a_command(tmp_path: Path) -> None:
    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.diagnose.rules import default_rules

    log = evil_log(tmp_path, tmp_path / "CANARY")
    diag = diagnose_file(log, default_rules())
    wl = from_log(log, diag.matches, "vllm")
    assert wl["launcher"] == "vllm-llm"                      # derived from the engine's own lines (an offline LLM)
    assert "argv" not in wl and "base_args" not in wl
    assert "launcher 'command'" in wl["header_dropped"] and "argv" in wl["header_dropped"]
    assert untrusted(wl) == []                                # what retest would run now is oomdoctor's own runner


@pytest.mark.slow
def test_canary_never_appears(tmp_path: Path) -> None:
    canary = tmp_path / "CANARY"
    card = tmp_path / "c.yaml"
    r = run_cli("diagnose", str(evil_log(tmp_path, canary)), "--out", str(card), "--no-device")
    assert r.returncode == 0, r.stderr
    r = run_cli("retest", str(card), "--engine", "real", "--timeout", "20")
    assert not canary.exists()
    assert "sh -c" not in r.stderr.split("command:")[-1]      # the command shown is not the header's
    # a card edited by hand to say "run this" is refused without --trust-card, with the exact command
    d = cardmod.load_dict(card)
    d["workload"].update(launcher="command", argv=["sh", "-c", f"id > {canary}; exit 1"])
    cardmod.save(d, card)
    r = run_cli("retest", str(card), "--engine", "real")
    assert r.returncode == 2 and not canary.exists()
    [line] = r.stderr.strip().splitlines()[-1:]
    assert line.startswith("oomdoctor: error: refusing to run what the card says without --trust-card")
    assert f"sh -c 'id > {canary}; exit 1'" in line
    r = run_cli("retest", str(card), "--dry-run")
    assert r.returncode == 0 and "a real run needs --trust-card" in r.stderr and not canary.exists()
    r = run_cli("retest", str(card), "--engine", "real", "--trust-card", "--lever", "none")
    assert canary.exists() and "uid=" in canary.read_text()  # the user said so


def test_code_loading_arguments_and_flag_models_need_trust() -> None:
    assert untrusted({"launcher": "vllm-serve", "model": "m", "engine_args": {"max_model_len": 8}}) == []
    why = untrusted({"launcher": "vllm-serve", "model": "--help", "engine_args": {"trust_remote_code": True,
                                                                                "worker_extension_cls": "x.Y"}})
    assert any("trust_remote_code, worker_extension_cls" in w for w in why) and any("'--help'" in w for w in why)
    assert untrusted({"launcher": "vllm-llm", "model": "m", "engine_args": {"trust_remote_code": False}}) == []
    with pytest.raises(Exception, match="--trust-card"):
        require_trusted({"launcher": "vllm-llm", "model": "m", "engine_args": {"worker_cls": "evil.W"}}, False)
    require_trusted({"launcher": "vllm-llm", "model": "m", "engine_args": {"worker_cls": "evil.W"}}, True)


@pytest.mark.parametrize("args", [
    {"distributed_executor_backend": "evilmod.Exec"},            # resolve_obj_by_qualname
    {"scheduler_cls": "evilmod.Sched"},
    {"log_config_file": "/tmp/log.json"},                         # dictConfig's "()" factories
    {"config": "/tmp/evil.yaml"},                                 # a vLLM --config file holds any argument
    {"kv_transfer_config": {"kv_connector": "X", "kv_connector_module_path": "evilmod", "kv_role": "kv_both"}},
    {"trust_remote": True},                                       # argparse expands a unique prefix
    {"worker_extension": "evilmod.Ext"},
    {"compilation_config": {"backend": "evilmod.compile"}},
    {"compilation_config": '{"inductor_passes": {"p": "evilmod.f"}}'},
    {"max_model_len": "--trust-remote-code"},                     # a value read as a flag
])
def test_every_code_loading_engine_argument_needs_trust(args) -> None:
    """Engine arguments that make vLLM import a module or class named by the card (found by reading vLLM 0.25.1's
    own sources: executor backends, scheduler classes, connector module paths, logging configs, --config files,
    argparse's prefix abbreviations) were run without --trust-card."""
    why = untrusted({"launcher": "vllm-llm", "model": "m", "engine_args": {"max_model_len": 8, **args}})
    assert why, args


def test_harmless_values_of_value_checked_arguments_stay_trusted() -> None:
    for args in ({"distributed_executor_backend": "mp"}, {"compilation_config": {"backend": "inductor", "mode": 3}},
                 {"compilation_config": '{"cudagraph_capture_sizes": [1, 2]}'}, {"max_model_len": "-1"}):
        assert untrusted({"launcher": "vllm-serve", "model": "m", "engine_args": args}) == [], args


def test_card_environment_is_filtered_unless_trusted() -> None:
    env = {"LD_PRELOAD": "/tmp/e.so", "PYTHONPATH": "/tmp/p", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "VLLM_USE_FLASHINFER_SAMPLER": "0", "PYTHONSTARTUP": "/tmp/s.py"}
    kept, held = safe_env(env, trusted=False)
    assert kept == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert held == ["LD_PRELOAD", "PYTHONPATH", "PYTHONSTARTUP"]
    assert safe_env(env, trusted=True) == (env, [])


# ----------------------------------------------------------------------------- SIGKILL
def _card(tmp_path: Path) -> tuple[Path, Path]:
    card = tmp_path / "a.yaml"
    r = run_cli("diagnose", str(FX / "A_fail.log"), "--out", str(card), "--no-device")
    assert r.returncode == 0, r.stderr
    d = yaml.safe_load(card.read_text())
    pids = tmp_path / "pids.txt"
    d["workload"].update(launcher="command", engine_args={}, base_args={}, argv=[
        sys.executable, str(FAKE), "--pids", str(pids), "--fail-log", str(FX / "A_fail.log"),
        "--pass-log", str(FX / "A_pass.log"), "--threshold", "2000000", "--hang"])
    d["workload"].pop("free_at_start_bytes", None)        # no ballast on a machine without a GPU
    cardmod.save(d, card)
    return card, pids


def _alive(pids: Path) -> list[int]:
    out = []
    for p in (int(x) for x in pids.read_text().split()):
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(p)
    return out


def _start_and_wait(card: Path, pids: Path, *extra: str) -> subprocess.Popen:
    e = dict(os.environ, OOMDOCTOR_NO_NVML="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "oomdoctor", "retest", str(card), "--engine", "real", "--trust-card",
                             *extra], cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.time() - t0 < 60:
        time.sleep(0.1)
    assert _alive(pids), "the fake engine tree should be running"
    return proc


@pytest.mark.slow
def test_sigkilled_retest_leaves_no_process(tmp_path: Path) -> None:
    card, pids = _card(tmp_path)
    before = card.read_text()
    proc = _start_and_wait(card, pids)
    proc.kill()                                           # SIGKILL: no handler runs in oomdoctor
    proc.communicate(timeout=30)
    t0 = time.time()
    while _alive(pids) and time.time() - t0 < 20:         # the watchdog ends the orphaned group
        time.sleep(0.2)
    assert not _alive(pids)
    assert card.read_text() == before
    runs = card.parent / "a.runs"
    assert (runs / "run.json").exists()                   # the killed run's file is left for the next run


@pytest.mark.slow
def test_next_run_ends_orphans_and_says_what_it_cleaned(tmp_path: Path) -> None:
    card, pids = _card(tmp_path)
    proc = _start_and_wait(card, pids)
    # the worst case: oomdoctor AND its watchdog are killed, the engine tree is orphaned under init
    wd = [int(p) for p in subprocess.run(["pgrep", "-f", "-P", str(proc.pid), "import os, signal"],
                                         capture_output=True, text=True).stdout.split()]
    assert wd, "a watchdog runs beside the engine"
    for w in wd:
        os.kill(w, signal.SIGKILL)
    proc.kill()
    proc.communicate(timeout=30)
    time.sleep(0.5)
    orphans = _alive(pids)
    assert orphans, "with the watchdog gone too, the engine tree is orphaned"
    first_log = card.parent / "a.runs" / "attempt-1-max_model_len.log"
    size = first_log.stat().st_size
    r = run_cli("retest", str(card), "--engine", "real", "--trust-card", "--timeout", "5")
    assert "cleaned up an earlier run that was killed" in r.stderr, r.stderr
    for p in orphans:
        assert str(p) in r.stderr
    assert not _alive(pids)
    a = cardmod.load_dict(card)["attempts"][-1]
    assert a["n"] == 1 and a["log_path"] == "a.runs/attempt-1-max_model_len.run2.log"   # its own log, not the killed run's
    assert first_log.stat().st_size == size
    assert "OOMDOCTOR_RESULT" not in first_log.read_text()
    assert not (card.parent / "a.runs" / "run.json").exists()


@pytest.mark.slow
def test_a_live_run_of_the_same_card_is_refused_with_its_pids(tmp_path: Path) -> None:
    card, pids = _card(tmp_path)
    proc = _start_and_wait(card, pids)
    try:
        r = run_cli("retest", str(card), "--engine", "real", "--trust-card", "--timeout", "5")
        assert r.returncode == 2
        assert f"another oomdoctor run (pid {proc.pid}" in r.stderr
        assert all(str(p) in r.stderr for p in _alive(pids)[:1])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert not _alive(pids)


def test_ladder_of_a_card_refuses_its_command_without_trust(tmp_path: Path) -> None:
    from tests.conftest import invoke

    canary = tmp_path / "CANARY"
    card = tmp_path / "c.yaml"
    assert invoke("diagnose", FX / "D_fail.log", "--out", card, "--no-device").rc == 0
    d = cardmod.load_dict(card)
    d["workload"].update(launcher="command", argv=["sh", "-c", f"id > {canary}"])
    cardmod.save(d, card)
    r = invoke("ladder", card, "--low", "3GiB", "--high", "12GiB", "--no-ballast")
    assert r.rc == 2 and not canary.exists()
    assert r.err.startswith("oomdoctor: error: refusing to run what the card says without --trust-card")
