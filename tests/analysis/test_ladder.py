"""The free-memory ladder: bisection to a stated precision in the fewest starts, every rung recorded in the card
as it is measured, resume after an interruption without re-running a rung, a changed workload starts afresh,
the declared requirement is compared, bad input exits 2 — with an injected runner (pass iff free >= a hidden
threshold) and through the real process path with tests/fake_ladder_engine.py replaying real vLLM 0.25.1 logs."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from oomdoctor.card import store as cardmod
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.card.build import build_card
from oomdoctor.errors import BadInput
from oomdoctor.analysis.ladder import (bracket_state, exit_code, expected_starts, next_rung, read_profile, run_ladder)
from oomdoctor.diagnose.rules import default_rules

ROOT = Path(__file__).resolve().parents[2]
FX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
FAKE = ROOT / "tests" / "fake_ladder_engine.py"
MiB, GiB = 1 << 20, 1 << 30
NO_DEVICE = {"status": "not_captured", "reason": "test", "source": "nvml", "gpus": []}
H200 = {"status": "captured", "gpus": [{"index": 0, "name": "NVIDIA H200", "total_bytes": 150_754_820_096,
                                        "free_bytes": 150_109_880_320}]}
D_WEIGHTS = 2_802_466_161          # "Model loading took 2.61 GiB" in D_pass.log
D_PIN = 3_000_000_000              # kv_cache_memory_bytes of D_pass


def quiet(_: str) -> None:
    pass


def make_card(tmp_path: Path, log: str = "D_pass.log", name: str = "d.yaml") -> Path:
    d = diagnose_file(FX / log, default_rules())
    card = tmp_path / name
    cardmod.save(build_card(FX / log, d, NO_DEVICE), card)
    return card


class Fake:
    """pass iff free >= threshold; remembers every free value it was started with."""

    def __init__(self, threshold: int, interrupt_after: int | None = None):
        self.threshold = threshold
        self.calls: list[int] = []
        self.interrupt_after = interrupt_after

    def __call__(self, free: int) -> bool:
        if self.interrupt_after is not None and len(self.calls) >= self.interrupt_after:
            raise KeyboardInterrupt
        self.calls.append(free)
        return free >= self.threshold


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    e = dict(os.environ, OOMDOCTOR_NO_NVML="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "oomdoctor", *args], capture_output=True, text=True, env=e, cwd=cwd,
                          timeout=180)


# ----------------------------------------------------------------------------- bisection
@pytest.mark.parametrize("threshold", [3 * GiB + 1, 4_000_000_000, 6_442_450_944, 7_046_430_720, 9 * GiB + 12345,
                                       12 * GiB - 300 * MiB])
def test_bisection_finds_the_hidden_threshold_in_log2_starts(tmp_path: Path, threshold: int) -> None:
    card = make_card(tmp_path)
    low, high, prec = 3 * GiB, 12 * GiB, 256 * MiB
    fake = Fake(threshold)
    lad = run_ladder(card, runner=fake, low=low, high=high, precision=prec, device=NO_DEVICE, progress=quiet)
    res = lad["result"]
    assert res["status"] == "measured"
    assert res["fails_at_bytes"] < threshold <= res["passes_at_bytes"]
    assert res["passes_at_bytes"] - res["fails_at_bytes"] <= prec
    bound = math.ceil(math.log2((high - low) / prec))            # 36 steps of 256 MiB → 6
    assert bound == expected_starts(low, high, prec) == 6
    interior = low + prec < threshold <= high - prec
    assert len(fake.calls) <= bound + (0 if interior else 1)
    if interior:
        assert all(r["role"] == "bisect" for r in lad["rungs"])   # the ends were never started
    assert len(set(fake.calls)) == len(fake.calls)                # no rung twice
    # every rung is in the card, in order, with its target, free memory and outcome
    on_disk = cardmod.load_dict(card)["ladder"]
    assert [r["target_free_bytes"] for r in on_disk["rungs"]] == fake.calls
    assert [r["k"] for r in on_disk["rungs"]] == list(range(1, len(fake.calls) + 1))
    assert all(r["outcome"] == ("pass" if r["target_free_bytes"] >= threshold else "fail") for r in on_disk["rungs"])
    assert on_disk["starts"] == len(fake.calls) and on_disk["status"] == "done"
    assert on_disk["result"]["threshold_bytes"] == res["passes_at_bytes"]
    assert on_disk["precision_bytes"] == prec
    assert on_disk["workload_fingerprint"].startswith("sha256:") and on_disk["config_fingerprint"].startswith("sha256:")
    assert (on_disk["engine"], on_disk["engine_version"]) == ("vllm", "0.25.1")
    # the pass/fail points also sit at the top of the section (what oomdoctor.profiles reads from a receipt)
    assert on_disk["pass_free_bytes"] == res["passes_at_bytes"] and on_disk["fail_free_bytes"] == res["fails_at_bytes"]
    # rungs are midpoints of the open interval rounded to the precision grid (anchored at low)
    assert all((t - low) % prec == 0 for t in fake.calls if t not in (low, high))
    assert exit_code(lad) == 0


def test_property_any_threshold_any_grid() -> None:
    """Pure bisection logic over many brackets: the answer always brackets the threshold within the precision."""
    import random

    rnd = random.Random(7)
    for _ in range(400):
        prec = rnd.choice([1, 64, 4096, 64 * MiB, 12345])
        low = rnd.randrange(0, 10**9)
        high = low + rnd.randrange(2, 300) * prec + rnd.randrange(0, prec)
        thr = rnd.randrange(low - prec, high + 2 * prec)
        rungs: list[dict] = []
        while True:
            act, t, role = next_rung(rungs, low, high, prec)
            if act == "done":
                break
            assert t not in {r["target_free_bytes"] for r in rungs}
            rungs.append({"target_free_bytes": t, "outcome": "pass" if t >= thr else "fail", "role": role})
        st = bracket_state(rungs, low, high)
        if role == "measured":
            assert st["lo"] < thr <= st["hi"] and st["hi"] - st["lo"] <= prec
        elif role == "no_start":
            assert thr > high
        else:
            assert role == "starts_at_low" and thr <= low
        assert sum(r["role"] == "bisect" for r in rungs) <= expected_starts(low, high, prec)


def test_high_end_is_verified_only_when_needed(tmp_path: Path) -> None:
    card = make_card(tmp_path)
    # never starts: the bisection closes on high, high is started once, the report says so
    fake = Fake(10**15)
    lad = run_ladder(card, runner=fake, low=3 * GiB, high=12 * GiB, precision=256 * MiB, device=NO_DEVICE, progress=quiet)
    assert lad["result"]["status"] == "no_start"
    assert "does not start even at --high" in lad["result"]["message"]
    assert [r["role"] for r in lad["rungs"]][-1] == "verify_high" and fake.calls[-1] == 12 * GiB
    assert len(fake.calls) == expected_starts(3 * GiB, 12 * GiB, 256 * MiB) + 1
    assert exit_code(lad) == 1
    # high derived from the device's free memory: "does not start even with everything free"
    card2 = make_card(tmp_path, name="d2.yaml")
    lad = run_ladder(card2, runner=Fake(10**15), precision=4 * GiB, device=H200, progress=quiet)
    assert lad["bracket"]["high_bytes"] == 150_109_880_320
    assert lad["result"]["message"].startswith("does not start even with everything free")


def test_low_end_is_verified_only_when_needed_and_derived_from_the_card(tmp_path: Path) -> None:
    card = make_card(tmp_path)
    prec = 64 * MiB
    fake = Fake(1)                         # starts with anything
    lad = run_ladder(card, runner=fake, high=12 * GiB, precision=prec, device=NO_DEVICE, progress=quiet)
    low = lad["bracket"]["low_bytes"]
    # weights (engine figure) + the pinned arena (exact setting), rounded down to the precision
    assert low == (D_WEIGHTS + D_PIN) // prec * prec
    assert "weights + pinned KV arena" in lad["bracket"]["low_source"]
    assert lad["result"]["status"] == "starts_at_low" and "starts even at the low end" in lad["result"]["message"]
    assert lad["rungs"][-1]["role"] == "verify_low" and fake.calls[-1] == low
    assert exit_code(lad) == 1


def test_margin_and_declared_requirement(tmp_path: Path) -> None:
    card = make_card(tmp_path)
    thr = 7_046_430_720
    lad = run_ladder(card, runner=Fake(thr), low=3 * GiB, high=12 * GiB, precision=64 * MiB, device=NO_DEVICE,
                     declared={"bytes": 6 * GiB, "source": "--declared"}, progress=quiet)
    res = lad["result"]
    m = res["margin"]
    assert m["weights_bytes"] == D_WEIGHTS and m["arena_bytes"] == D_PIN
    assert m["weights_plus_arena_bytes"] == D_WEIGHTS + D_PIN
    assert m["margin_bytes"] == res["threshold_bytes"] - D_WEIGHTS - D_PIN
    assert m["more_than_bytes"] == res["fails_at_bytes"] - D_WEIGHTS - D_PIN
    d = res["declared"]
    assert d["verdict"] == "under" and d["by_bytes"] == res["threshold_bytes"] - 6 * GiB
    assert d["message"].startswith(f"under-declared by {res['threshold_bytes'] - 6 * GiB:,} bytes")
    assert exit_code(lad) == 1                                # an under-declared requirement fails the ladder
    # over-declared, read from a serving profile (incident 1's shape of profiles)
    prof = tmp_path / "profiles.yaml"
    prof.write_text(yaml.safe_dump({"profiles": {"long_393k": {"requires_free_bytes": 24_053_735_802,
                                                               "settings": {"gpu_memory_utilization": 0.95}},
                                                 "small": {"requires_free_bytes": "8GiB"}}}))
    dec = read_profile(prof, "small")
    assert dec["bytes"] == 8 * GiB and "small" in dec["source"]
    lad = run_ladder(card, runner=Fake(thr), low=3 * GiB, high=12 * GiB, precision=64 * MiB, device=NO_DEVICE,
                     declared=dec, progress=quiet)
    d = lad["result"]["declared"]
    assert d["verdict"] == "over" and d["by_bytes"] == 8 * GiB - lad["result"]["threshold_bytes"]
    assert d["message"].startswith("over-declared by ")
    assert exit_code(lad) == 0
    with pytest.raises(BadInput, match="not in"):
        read_profile(prof, "raw_1010k")


def test_incident_1_figures_under_declared() -> None:
    """Incident 1: long_393k fails at 25,371,803,648 and starts at 25,571,033,088, declared 24,053,735,802."""
    from oomdoctor.analysis.ladder import compare_declared

    res = {"status": "measured", "threshold_bytes": 25_571_033_088, "fails_at_bytes": 25_371_803_648}
    d = compare_declared(res, {"bytes": 24_053_735_802, "source": "profile long_393k"})
    assert d["verdict"] == "under" and d["by_bytes"] == 1_517_297_286          # "under by about 1.5 GB"
    d = compare_declared(res, {"bytes": 25_400_000_000, "source": "x"})
    assert d["verdict"] == "within_precision"


# ----------------------------------------------------------------------------- resume
def test_resume_after_interruption_measures_no_rung_twice(tmp_path: Path) -> None:
    thr = 8_100_000_000
    ref = Fake(thr)
    ref_lad = run_ladder(make_card(tmp_path, name="ref.yaml"), runner=ref, low=3 * GiB, high=12 * GiB,
                         precision=64 * MiB, device=NO_DEVICE, progress=quiet)
    card = make_card(tmp_path)
    first = Fake(thr, interrupt_after=3)
    with pytest.raises(KeyboardInterrupt):
        run_ladder(card, runner=first, low=3 * GiB, high=12 * GiB, precision=64 * MiB, device=NO_DEVICE, progress=quiet)
    mid = cardmod.load_dict(card)["ladder"]
    assert mid["status"] == "interrupted" and len(mid["rungs"]) == 3 and "result" not in mid
    second = Fake(thr)
    msgs: list[str] = []
    lad = run_ladder(card, runner=second, low=3 * GiB, high=12 * GiB, precision=64 * MiB, device=NO_DEVICE,
                     progress=msgs.append)
    assert any(m.startswith("resuming: 3 rung(s) already measured") for m in msgs)
    assert not set(first.calls) & set(second.calls)                        # no rung measured twice
    assert first.calls + second.calls == ref.calls                          # the same ladder, split in two
    assert lad["result"]["passes_at_bytes"] == ref_lad["result"]["passes_at_bytes"]
    assert lad["starts"] == len(ref.calls) and lad["status"] == "done"
    # a finished ladder re-run starts nothing
    third = Fake(thr)
    lad = run_ladder(card, runner=third, low=3 * GiB, high=12 * GiB, precision=64 * MiB, device=NO_DEVICE, progress=quiet)
    assert third.calls == [] and lad["result"]["status"] == "measured"
    # max_starts stops early (resumable), then the rest
    card3 = make_card(tmp_path, name="c3.yaml")
    lad = run_ladder(card3, runner=Fake(thr), low=3 * GiB, high=12 * GiB, precision=64 * MiB, device=NO_DEVICE,
                     max_starts=2, progress=quiet)
    assert lad["status"] == "incomplete" and lad["starts"] == 2 and "run the same command again" in lad["result"]["message"]
    assert exit_code(lad) == 1


def test_changed_fingerprint_starts_afresh_and_says_so(tmp_path: Path) -> None:
    card = make_card(tmp_path)
    run_ladder(card, runner=Fake(7 * GiB), low=3 * GiB, high=12 * GiB, precision=256 * MiB, device=NO_DEVICE, progress=quiet)
    before = cardmod.load_dict(card)["ladder"]
    d = cardmod.load_dict(card)
    d["workload"]["engine_args"]["kv_cache_memory_bytes"] = 4_400_000_000     # another workload
    cardmod.save(d, card)
    msgs: list[str] = []
    fake = Fake(8 * GiB)
    lad = run_ladder(card, runner=fake, low=3 * GiB, high=12 * GiB, precision=256 * MiB, device=NO_DEVICE,
                     progress=msgs.append)
    assert any(m.startswith("starting afresh: the workload changed") for m in msgs)
    assert lad["workload_fingerprint"] != before["workload_fingerprint"]
    assert len(fake.calls) == len(lad["rungs"]) > 0                         # all measured again
    assert lad["previous"][-1]["workload_fingerprint"] == before["workload_fingerprint"]
    assert lad["previous"][-1]["result"]["passes_at_bytes"] == before["result"]["passes_at_bytes"]
    assert lad["result"]["margin"]["arena_bytes"] == 4_400_000_000
    # --fresh does the same on purpose
    msgs.clear()
    run_ladder(card, runner=Fake(8 * GiB), low=3 * GiB, high=12 * GiB, precision=256 * MiB, device=NO_DEVICE,
               fresh=True, progress=msgs.append)
    assert any("starting afresh: --fresh" in m for m in msgs)


# ----------------------------------------------------------------------------- bad input
def test_bad_input_is_refused(tmp_path: Path) -> None:
    card = make_card(tmp_path)
    kw = dict(runner=Fake(1), device=NO_DEVICE, progress=quiet)
    with pytest.raises(BadInput, match="precision must be positive"):
        run_ladder(card, low=3 * GiB, high=12 * GiB, precision=0, **kw)
    with pytest.raises(BadInput, match="must be below high"):
        run_ladder(card, low=12 * GiB, high=3 * GiB, **kw)
    with pytest.raises(BadInput, match="--high is needed"):
        run_ladder(card, low=3 * GiB, **kw)
    d = cardmod.load_dict(card)
    d["workload"] = {}
    cardmod.save(d, tmp_path / "nowl.yaml")
    with pytest.raises(BadInput, match="no workload"):
        run_ladder(tmp_path / "nowl.yaml", low=3 * GiB, high=12 * GiB, **kw)
    d["workload"] = {"launcher": "unknown"}
    cardmod.save(d, tmp_path / "unk.yaml")
    with pytest.raises(BadInput, match="how the engine was launched"):
        run_ladder(tmp_path / "unk.yaml", low=3 * GiB, high=12 * GiB, **kw)
    assert "ladder" not in cardmod.load_dict(card)                          # nothing was written


@pytest.mark.slow
@pytest.mark.parametrize("args,msg", [
    (["--precision", "0"], "precision must be positive"),
    (["--low", "12GiB", "--high", "3GiB"], "must be below high"),
    (["--low", "3GiB", "--high", "12GiB", "--profile", "x"], "--profile-file and --profile go together"),
    (["--low", "3GiB", "--high", "12GiB", "--precision", "lots"], "not a memory size"),
    (["--low", "3GiB", "--high", "12GiB"], "NVML"),         # a ballast needs NVML: refused on this CPU machine
])
def test_cli_bad_input_exits_2(tmp_path: Path, args: list[str], msg: str) -> None:
    card = make_card(tmp_path)
    r = run_cli("ladder", str(card), *args)
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_cli_card_without_workload_exits_2(tmp_path: Path) -> None:
    card = make_card(tmp_path)
    d = cardmod.load_dict(card)
    d["workload"] = {}
    cardmod.save(d, card)
    r = run_cli("ladder", str(card), "--low", "3GiB", "--high", "12GiB", "--no-ballast")
    assert r.returncode == 2 and "no workload" in r.stderr
    r = run_cli("ladder")
    assert r.returncode == 2 and "give a CARD" in r.stderr


# ----------------------------------------------------------------------------- the real process path
def command_card(tmp_path: Path, threshold: int) -> tuple[Path, Path]:
    calls = tmp_path / "calls.txt"
    d = cardmod.load_dict(make_card(tmp_path, name="base.yaml"))
    d["workload"].update(launcher="command", argv=[sys.executable, str(FAKE), "--threshold", str(threshold),
                                                   "--pass-log", str(FX / "D_pass.log"), "--fail-log", str(FX / "D_fail.log"),
                                                   "--calls", str(calls)], engine_args={}, base_args={})
    d["workload"].pop("free_at_start_bytes", None)
    card = tmp_path / "cmd.yaml"
    cardmod.save(d, card)
    return card, calls


@pytest.mark.slow
def test_engine_runner_through_real_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OOMDOCTOR_NO_NVML", "1")
    thr = 7_000_000_000
    card, calls = command_card(tmp_path, thr)
    lad = run_ladder(card, low=4 * GiB, high=10 * GiB, precision=128 * MiB, ballast=False, device=NO_DEVICE,
                     timeout_s=60, progress=quiet)
    res = lad["result"]
    assert res["status"] == "measured" and res["fails_at_bytes"] < thr <= res["passes_at_bytes"]
    started = [int(x) for x in calls.read_text().split()]
    assert started == [r["target_free_bytes"] for r in lad["rungs"]]     # the target reached the engine, once each
    assert len(started) == expected_starts(4 * GiB, 10 * GiB, 128 * MiB)
    for r in lad["rungs"]:
        assert (card.parent / r["log_path"]).exists()
        assert r["free_source"].startswith("target")                      # no ballast: not a device measurement
        if r["outcome"] == "fail":
            # the decisive line of D_fail.log and its numbers: OOM allocating the pinned 7.5e9 arena
            assert r["class"] == "kv_allocation_oom" and r["served"] is False
            assert r["decisive"]["rule"] == "vllm.cuda_oom.torch"
            assert r["decisive"]["numbers"]["tried_to_allocate_bytes"] == 469_762_048
        else:
            assert r["class"] == "unknown" and r["served"] is True
            assert r["ledger"]["weights_bytes"] == D_WEIGHTS and r["ledger"]["kv_cache_tokens"] == 45_776
    # the margin comes from the passing rung's own log (weights 2.61 GiB, arena 2.79 GiB as printed)
    assert res["margin"]["weights_bytes"] == D_WEIGHTS and res["margin"]["arena_bytes"] == 2_995_739_689


@pytest.mark.slow
def test_cli_command_workload_json_and_resume(tmp_path: Path) -> None:
    thr = 6_500_000_000
    calls = tmp_path / "calls.txt"
    out = tmp_path / "cmd.yaml"
    argv = ["ladder", "--low", "5GiB", "--high", "9GiB", "--precision", "256MiB", "--no-ballast", "--json",
            "--declared", "6000000000", "--out", str(out), "--",
            sys.executable, str(FAKE), "--threshold", str(thr), "--pass-log", str(FX / "D_pass.log"),
            "--fail-log", str(FX / "D_fail.log"), "--calls", str(calls)]
    r = run_cli(*argv, cwd=tmp_path)
    assert r.returncode == 1, r.stderr                                      # under-declared → 1
    j = json.loads(r.stdout)
    assert j["card"] == str(out) and j["result"]["status"] == "measured"
    assert j["result"]["fails_at_bytes"] < thr <= j["result"]["passes_at_bytes"]
    assert j["result"]["declared"]["verdict"] == "under"
    assert "rung 1" in r.stderr and "→" in r.stderr                         # progress on stderr
    n = len(calls.read_text().split())
    assert n == j["starts"] == expected_starts(5 * GiB, 9 * GiB, 256 * MiB)
    saved = cardmod.load_dict(out)
    assert saved["workload"]["launcher"] == "command" and saved["ladder"]["rungs"] == j["rungs"]
    # the same command again: resumes from the card, starts nothing
    r = run_cli(*argv, cwd=tmp_path)
    assert len(calls.read_text().split()) == n and "resuming" in r.stderr
    # without --json: the table and the verdict on stdout
    r = run_cli(*[a for a in argv if a != "--json"], cwd=tmp_path)
    assert "starts at ≥" in r.stdout and "under-declared by" in r.stdout
    # --out holding another workload is refused
    other = [a if a != str(thr) else "1" for a in argv]
    r = run_cli(*other, cwd=tmp_path)
    assert r.returncode == 2 and "holds another workload" in r.stderr


@pytest.mark.slow
def test_a_failure_that_is_not_memory_stops_the_ladder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No engine, no GPU, a missing model: not a rung of the memory ladder — stop, record it as an error, do not
    let it pull the threshold up; a later run ignores it."""
    monkeypatch.setenv("OOMDOCTOR_NO_NVML", "1")
    card, _ = command_card(tmp_path, 1)
    d = cardmod.load_dict(card)
    d["workload"]["argv"] = [sys.executable, "-c", "import sys; print('RuntimeError: No CUDA GPUs are available'); sys.exit(1)"]
    cardmod.save(d, card)
    lad = run_ladder(card, low=4 * GiB, high=10 * GiB, precision=128 * MiB, ballast=False, device=NO_DEVICE,
                     timeout_s=60, progress=quiet)
    assert [r["outcome"] for r in lad["rungs"]] == ["error"] and lad["rungs"][0]["class"] == "not_memory"
    assert lad["status"] == "stopped" and lad["result"]["status"] == "error"
    assert "not memory" in lad["result"]["message"] and exit_code(lad) == 1
    # the error rung narrows nothing: the next run measures the same target for real
    fake = Fake(6 * GiB)
    lad = run_ladder(card, runner=fake, low=4 * GiB, high=10 * GiB, precision=128 * MiB, device=NO_DEVICE, progress=quiet)
    assert fake.calls[0] == lad["rungs"][0]["target_free_bytes"] and lad["result"]["status"] == "measured"


def test_another_device_starts_afresh(tmp_path: Path) -> None:
    card = make_card(tmp_path)
    run_ladder(card, runner=Fake(7 * GiB), low=3 * GiB, high=12 * GiB, precision=1 * GiB, device=H200, progress=quiet)
    assert cardmod.load_dict(card)["ladder"]["device"] == "nvidia-h200"
    other = {"status": "captured", "gpus": [{**H200["gpus"][0], "name": "NVIDIA GeForce RTX 5090"}]}
    msgs: list[str] = []
    run_ladder(card, runner=Fake(7 * GiB), low=3 * GiB, high=12 * GiB, precision=1 * GiB, device=other, progress=msgs.append)
    assert any("starting afresh: another device (nvidia-h200 → nvidia-geforce-rtx-5090)" in m for m in msgs)


def test_profiles_module_reads_the_ladder_section(tmp_path: Path) -> None:
    """The serving-profile reader (oomdoctor.profiles, when present) takes a ladder card as its receipt."""
    profiles = pytest.importorskip("oomdoctor.profiles")
    card = make_card(tmp_path)
    lad = run_ladder(card, runner=Fake(7_046_430_720), low=3 * GiB, high=12 * GiB, precision=64 * MiB, device=H200,
                     progress=quiet)
    got = profiles.read_ladder(card)
    assert got["pass_free_bytes"] == lad["result"]["threshold_bytes"]
    assert got["fail_free_bytes"] == lad["result"]["fails_at_bytes"]
    assert got["engine_version"] == "0.25.1"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [2, 15])      # SIGINT, SIGTERM
def test_killed_ladder_keeps_its_rungs_and_leaves_no_process(tmp_path: Path, sig: int) -> None:
    import time

    thr = 7_000_000_000
    card, calls = command_card(tmp_path, thr)
    pids = tmp_path / "pids.txt"
    d = cardmod.load_dict(card)
    d["workload"]["argv"] += ["--pids", str(pids)]
    cardmod.save(d, card)
    args = [sys.executable, "-m", "oomdoctor", "ladder", str(card), "--low", "4GiB", "--high", "10GiB",
            "--precision", "128MiB", "--no-ballast", "--trust-card"]   # the card runs its own command
    env = dict(os.environ, OOMDOCTOR_NO_NVML="1", PYTHONPATH=str(ROOT), FAKE_LADDER_HANG_AFTER="2")
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while (not pids.exists() or len(pids.read_text().split()) < 6) and time.time() - t0 < 60:
        time.sleep(0.1)                          # 3 engine trees started: rungs 1 and 2 done, rung 3 hangs
    time.sleep(0.5)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    lad = cardmod.load_dict(card)["ladder"]
    assert lad["status"] == "interrupted" and len(lad["rungs"]) == 2
    time.sleep(0.5)
    for p in (int(x) for x in pids.read_text().split()):
        try:
            state = Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        assert state == "Z", f"pid {p} is still running"
    # resume: the two recorded rungs are not started again
    env.pop("FAKE_LADDER_HANG_AFTER")
    r = subprocess.run(args + ["--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    started = [int(x) for x in calls.read_text().split()]
    assert len(started) == len(set(started)) == json.loads(r.stdout)["starts"]
