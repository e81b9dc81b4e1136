"""Cards and receipts are never clobbered (issue 16, items 3 and 7): 20 concurrent appends keep 20 attempts,
a symlink at ``CARD.lock`` truncates nothing, and ``--out`` refuses a FIFO, a device node, a file that is not a
card and a card whose attempts a new card would drop — each with one ``oomdoctor: error:`` line, exit 2."""
from __future__ import annotations

import multiprocessing as mp
import os
import stat
from pathlib import Path

import pytest

from oomdoctor.card import store as cardmod
from oomdoctor.errors import CardError
from tests.conftest import FIXTURES, invoke

N = 20
ROUNDS = 3


def _card(tmp_path: Path) -> Path:
    card = tmp_path / "a.yaml"
    r = invoke("diagnose", FIXTURES / "A_fail.log", "--out", card, "--no-device")
    assert r.rc == 0, r.err
    return card


def _attempt(i: int, k: int = 0) -> dict:
    return {"at": f"2026-12-01T00:{k:02d}:{i:02d}Z", "lever": "none", "change": {}, "outcome": "predicted_fail",
            "engine": {"name": "vllm", "version": "0.25.1", "mode": "twin"}, "config_fingerprint": "sha256:" + "0" * 64,
            "notes": [f"writer {i} round {k}"]}


def _append(card: str, i: int, go) -> None:
    go.wait()
    for k in range(ROUNDS):                 # later rounds open the lock after others released it: the unlink race
        cardmod.append_attempt(card, _attempt(i, k))


@pytest.mark.slow
def test_twenty_concurrent_writers_lose_no_attempt(tmp_path: Path) -> None:
    card = _card(tmp_path)
    ctx = mp.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_append, args=(str(card), i, go)) for i in range(N)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * N
    atts = cardmod.load_dict(card)["attempts"]
    assert len(atts) == N * ROUNDS
    assert [a["n"] for a in atts] == list(range(1, N * ROUNDS + 1))
    assert sorted(a["notes"][0] for a in atts) == sorted(f"writer {i} round {k}" for i in range(N) for k in range(ROUNDS))
    assert not list(tmp_path.glob("*.lock")) and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.slow
def test_twin_retests_in_parallel_keep_every_attempt(tmp_path: Path) -> None:
    """The issue's reproduction, through the CLI: parallel `retest --engine twin` on one card."""
    import subprocess
    import sys

    card = _card(tmp_path)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), OOMDOCTOR_NO_NVML="1")
    k = 8
    ps = [subprocess.Popen([sys.executable, "-m", "oomdoctor", "retest", str(card), "--engine", "twin"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(k)]
    assert [p.wait(120) for p in ps] == [4] * k          # a twin run is a prediction: exit 4
    assert [a["n"] for a in cardmod.load_dict(card)["attempts"]] == list(range(1, k + 1))


def test_symlink_at_the_lock_path_truncates_nothing(tmp_path: Path) -> None:
    card = _card(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "a.yaml.lock").symlink_to(victim)
    r = invoke("retest", card, "--engine", "twin")
    assert r.rc == 4, r.err                                   # a twin run: a prediction
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "a.yaml.lock").is_symlink()            # not followed, not replaced


def _bad_out(target: Path) -> str:
    r = invoke("diagnose", FIXTURES / "A_fail.log", "--out", target, "--no-device")
    assert r.rc == 2, (r.out, r.err)
    [line] = r.err_lines
    assert line.startswith("oomdoctor: error: ") and "Traceback" not in r.err
    return line


def test_out_onto_a_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    assert "is a FIFO, not a regular file" in _bad_out(fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_out_onto_a_device_node_is_refused(tmp_path: Path) -> None:
    dev = tmp_path / "null-copy"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))      # a private /dev/null: no system node is at risk
    except PermissionError:
        pytest.skip("creating a device node needs root")
    assert "is a device node" in _bad_out(dev)
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_out_onto_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep\n")
    link = tmp_path / "c.yaml"
    link.symlink_to(target)
    assert "is a symlink" in _bad_out(link)
    assert target.read_text() == "keep\n" and link.is_symlink()


def test_out_onto_a_file_that_is_not_a_card_is_refused(tmp_path: Path) -> None:
    notes = tmp_path / "notes.yaml"
    notes.write_text("todo: buy milk\n")
    assert "exists and is not an incident card; not overwritten" in _bad_out(notes)
    assert notes.read_text() == "todo: buy milk\n"


def test_out_onto_a_card_with_attempts_is_refused_and_keeps_them(tmp_path: Path) -> None:
    card = _card(tmp_path)
    for _ in range(2):
        assert invoke("retest", card, "--engine", "twin").rc == 4
    before = card.read_text()
    assert "holds 2 attempt(s) (n=1, 2) that the new card would drop" in _bad_out(card)
    assert card.read_text() == before
    # a card without attempts may be replaced (a re-diagnosis), and saving a card that keeps them is fine
    d = cardmod.load_dict(card)
    d["summary"] = "edited"
    cardmod.save(d, card)
    assert len(cardmod.load_dict(card)["attempts"]) == 2


def test_reading_a_fifo_as_a_card_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    with pytest.raises(CardError, match="not a regular file"):
        cardmod.load_dict(fifo)
    r = invoke("retest", fifo, "--engine", "twin")
    assert r.rc == 2 and r.err.startswith("oomdoctor: error:")


def test_a_symlinked_runs_folder_is_refused_not_followed(tmp_path: Path) -> None:
    """`CARD.runs -> elsewhere`: a retest wrote its run file and the engine's log (attempt-1-<lever>.log) into the
    link's target; a receipt's log copy and the ladder's logs went the same way."""
    from oomdoctor.analysis.ladder.runner import EngineRunner
    from oomdoctor.card import receipt  # noqa: F401 - receipt_write is imported through it
    from oomdoctor.card.receipt_write import _copy_log
    from oomdoctor.retest import runfile

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    runs = tmp_path / "c.runs"
    runs.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CardError, match="is a symlink, not a folder"):
        with runfile.active(runs, lambda s: None):
            pass
    log = tmp_path / "run.log"
    log.write_text("INFO x\n")
    with pytest.raises(CardError, match="is a symlink, not a folder"):
        _copy_log(log, tmp_path / "c.yaml", 1)
    from types import SimpleNamespace

    runner = EngineRunner.__new__(EngineRunner)
    runner.runs_dir, runner.baseline_free, runner.ballast, runner.plan = runs, None, False, SimpleNamespace(env={})
    with pytest.raises(CardError, match="is a symlink, not a folder"):
        runner(1 << 30)
    assert list(elsewhere.iterdir()) == []
