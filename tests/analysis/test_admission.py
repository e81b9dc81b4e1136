"""KV-aware admission: the arithmetic of incident 2 (docs/incidents.md), FIFO fairness, the permanent reject.

Incident 2 (a Rust engine, TP=2, Qwen 27B) gives its figures in "MB"; checked below, they are MiB
(2^20 bytes): (67,881 + 8,192) x 32,768 B = 2,492,760,064 B = 2,377.28 MiB, printed "2,377 MB".
"""
from __future__ import annotations

import json

import pytest

from oomdoctor.analysis.admission import ADMIT, QUEUE, REJECT, KvAdmission, Request, decide, need_bytes, p95, wait_deadline
from oomdoctor.cli import main
from oomdoctor.errors import BadInput

MiB = 1 << 20
BPT = 32_768                          # incident 2: KV bytes per token per card
BUDGET = 4_713 * MiB                  # incident 2: budget captured at load (free at load 9,285 MiB)


def run(args, capsys):
    with pytest.raises(SystemExit) as ex:
        main(args)
    out, err = capsys.readouterr()
    return ex.value.code, out, err


# ----------------------------------------------------------------------------- incident 2's numbers
def test_incident2_request_need():
    need = need_bytes(67_881, 8_192, BPT)
    assert need == 2_492_760_064 == 76_073 * 32_768
    assert need // MiB == 2_377                              # "2,377 MB" is MiB, rounded down
    assert need / MiB == pytest.approx(2_377.28, abs=0.01)
    # the VRAM backstop it failed: KV + 2,048 activation + 1,500 floor = 5,925 needed vs 4,835 free
    assert 2_377 + 2_048 + 1_500 == 5_925 > 4_835


def test_incident2_budget_figures_are_consistent():
    # free at load 9,285 MiB → budget 4,713 MiB: 4,572 MiB of reserves. The text names a 2,048 activation
    # headroom and a 1,500 floor (3,548); the other 1,024 MiB are not explained there, so not asserted.
    assert 9_285 - 4_713 == 4_572
    # the 67,881-token request fits the KV budget: with the byte gate it is admissible (the fix) ...
    d = decide(BUDGET, BPT, 67_881, 8_192)
    assert d.verdict == ADMIT and d.free_bytes - d.need_bytes == BUDGET - 2_492_760_064
    # ... and a second one while the first runs waits instead of getting a 503
    d2 = decide(BUDGET, BPT, 67_881, 8_192, in_use_bytes=d.need_bytes)
    assert d2.verdict == QUEUE and d2.queue_position == 1 and not d2.permanent
    assert 2 * 2_492_760_064 > BUDGET


def test_incident2_18020_token_prompt_reserved_819_mib():
    """"an 18,020-token prompt reserved exactly 819 MiB and returned it".

    With the incident's 32,768 B/token and its 8,192 reserved output tokens: (18,020 + 8,192) x 32,768
    = 858,914,816 B = 819.125 MiB, i.e. 819 permits when permits are whole MiB rounded down (as the
    "2,377 MB" above). Honest check: 819 MiB exactly would need 858,783,744 / 26,212 = 32,763.0 B/token,
    not an integer, and no whole output count gives exactly 819 MiB at 32,768 B/token with an 18,020 prompt
    (819 MiB / 32,768 = 26,208 tokens → 8,188 output, not the 8,192 the incident reserves). So the
    figures agree with 32,768 B/token and floor-rounded MiB permits, not with byte-exact 819 MiB."""
    need = need_bytes(18_020, 8_192, BPT)
    assert need == 858_914_816
    assert need // MiB == 819 and need % MiB == MiB // 8        # 819.125 MiB
    assert -(-need // MiB) == 820                               # ceil would have said 820: not what was seen
    derived = 819 * MiB / (18_020 + 8_192)
    assert derived == pytest.approx(32_763.0, abs=0.1) and abs(derived - BPT) / BPT < 2e-4
    assert (819 * MiB) % BPT == 0 and (819 * MiB) // BPT - 18_020 == 8_188

    gate = KvAdmission(BUDGET, BPT)
    r = Request(18_020, 8_192)
    assert gate.try_admit(r).verdict == ADMIT
    assert gate.in_use_bytes == need and gate.in_use_bytes // MiB == 819
    assert gate.release(r) == []
    assert gate.in_use_bytes == 0 and gate.free_bytes == BUDGET          # returned, all of it


# ----------------------------------------------------------------------------- never admissible
def test_larger_than_whole_budget_is_rejected_permanently(capsys):
    max_tokens = BUDGET // BPT
    assert max_tokens == 150_816
    d = decide(BUDGET, BPT, max_tokens, 1)
    assert d.verdict == REJECT and d.permanent and d.exit_code == 1
    assert "never" in d.reason and "150,816" in d.reason
    assert decide(BUDGET, BPT, max_tokens, 0).verdict == ADMIT            # the exact budget fits

    gate = KvAdmission(BUDGET, BPT)
    big = Request(200_000, 8_192)
    assert gate.try_admit(big).verdict == REJECT
    assert gate.queue == () and gate.in_use_bytes == 0                   # it never waits


def test_permanent_reject_even_when_others_wait():
    d = decide(BUDGET, BPT, 300_000, 0, in_use_bytes=BUDGET, queue_ahead=5)
    assert d.verdict == REJECT and d.permanent


# ----------------------------------------------------------------------------- FIFO fairness
def test_large_head_is_not_starved_by_small_requests():
    gate = KvAdmission(100 * BPT, BPT)
    a = Request(60)
    assert gate.try_admit(a).verdict == ADMIT                            # 60 of 100 in use
    big = Request(80)
    d = gate.try_admit(big)
    assert d.verdict == QUEUE and d.queue_position == 1                  # needs 80, 40 free
    small = Request(10)
    d = gate.try_admit(small)                                            # would fit the 40 free ...
    assert d.verdict == QUEUE and d.queue_position == 2                  # ... but does not overtake
    assert gate.queue == (big, small) and gate.running == (a,)
    assert gate.try_admit(small).verdict == QUEUE                        # asking again does not help
    admitted = gate.release(a)
    assert admitted == [big, small]                                      # 80 + 10 <= 100: both, in order
    assert gate.in_use_bytes == 90 * BPT and gate.queue == ()


def test_release_stops_at_a_head_that_does_not_fit():
    gate = KvAdmission(100 * BPT, BPT)
    a, b = Request(50), Request(50)
    assert gate.try_admit(a).verdict == ADMIT and gate.try_admit(b).verdict == ADMIT
    big, s1, s2 = Request(90), Request(5), Request(5)
    for r in (big, s1, s2):
        assert gate.try_admit(r).verdict == QUEUE
    assert gate.release(a) == []                                         # 50 free < 90: nobody overtakes
    assert gate.queue == (big, s1, s2)
    assert gate.release(b) == [big, s1, s2]                              # 90 + 5 + 5 = 100
    assert gate.free_bytes == 0


def test_asking_again_reports_the_current_position():
    gate = KvAdmission(100 * BPT, BPT)
    a = Request(70)
    gate.try_admit(a)
    big, small = Request(90), Request(20)
    assert gate.try_admit(big).queue_position == 1
    assert gate.try_admit(small).queue_position == 2
    assert gate.release(a) == [big]                                      # 90 in use, small (20) must wait
    d = gate.try_admit(small)
    assert d.verdict == QUEUE and d.queue_position == 1 and gate.queue == (small,)


def test_cancel_unblocks_the_queue():
    gate = KvAdmission(100 * BPT, BPT)
    gate.try_admit(Request(60))
    big, small = Request(80), Request(10)
    gate.try_admit(big)
    gate.try_admit(small)
    assert gate.cancel(big) == [small]
    assert gate.queue == ()
    with pytest.raises(BadInput):
        gate.cancel(big)


def test_queue_depth_limit_rejects_for_now():
    gate = KvAdmission(100 * BPT, BPT, max_queue=1)
    gate.try_admit(Request(100))
    assert gate.try_admit(Request(10)).verdict == QUEUE
    d = gate.try_admit(Request(10))
    assert d.verdict == REJECT and not d.permanent and "queue full" in d.reason
    assert len(gate.queue) == 1


def test_release_returns_permits_and_state():
    gate = KvAdmission(BUDGET, BPT)
    r1, r2 = Request(67_881, 8_192), Request(18_020, 8_192)
    gate.try_admit(r1)
    gate.try_admit(r2)
    st = gate.state()
    assert st["in_use_bytes"] == 2_492_760_064 + 858_914_816 and st["running"] == [r1.id, r2.id]
    gate.release(r1)
    assert gate.in_use_bytes == 858_914_816
    gate.release(r2)
    assert gate.in_use_bytes == 0
    with pytest.raises(BadInput):
        gate.release(r2)                                                 # twice: an error, not negative permits
    assert gate.try_admit(r1).verdict == ADMIT
    with pytest.raises(BadInput):
        gate.try_admit(r1)                                               # already admitted


# ----------------------------------------------------------------------------- wait deadline
def test_deadline_is_p95_of_measured_durations_times_position():
    durations = [70, 80, 90, 100, 110, 120, 130, 140, 145, 150]
    assert p95(durations) == 150                                         # nearest rank: ceil(9.5) = 10th
    assert p95(list(range(1, 101))) == 95
    assert wait_deadline(3, durations) == (450.0, 150.0)
    d = decide(BUDGET, BPT, 18_020, 8_192, in_use_bytes=BUDGET, queue_ahead=2, durations_s=durations)
    assert d.verdict == QUEUE and d.queue_position == 3 and d.wait_deadline_s == 450.0
    assert d.wait_deadline_s != 5                                        # not incident 2's fixed Retry-After: 5
    d = decide(BUDGET, BPT, 18_020, 8_192, in_use_bytes=BUDGET)
    assert d.wait_deadline_s is None and "no measured" in d.reason
    gate = KvAdmission(100 * BPT, BPT, durations_s=[10, 20])
    gate.try_admit(Request(100))
    gate.record_duration(30)
    assert gate.try_admit(Request(1)).wait_deadline_s == 30.0


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs", [
    dict(budget_bytes=0, kv_bytes_per_token=BPT, prompt_tokens=1),
    dict(budget_bytes=BUDGET, kv_bytes_per_token=0, prompt_tokens=1),
    dict(budget_bytes=BUDGET, kv_bytes_per_token=BPT, prompt_tokens=-1),
    dict(budget_bytes=BUDGET, kv_bytes_per_token=BPT, prompt_tokens=0, max_output_tokens=0),
    dict(budget_bytes=BUDGET, kv_bytes_per_token=BPT, prompt_tokens=1.5),
    dict(budget_bytes=BUDGET, kv_bytes_per_token=BPT, prompt_tokens=1, in_use_bytes=BUDGET + 1),
    dict(budget_bytes=BUDGET, kv_bytes_per_token=BPT, prompt_tokens=1, queue_ahead=-1),
    dict(budget_bytes=BUDGET, kv_bytes_per_token=BPT, prompt_tokens=1, in_use_bytes=BUDGET, durations_s=[0]),
])
def test_decide_bad_input(kwargs):
    with pytest.raises(BadInput):
        decide(**kwargs)


# ----------------------------------------------------------------------------- CLI
def test_cli_admit(capsys):
    rc, out, err = run(["admit", "--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "67881:8192"], capsys)
    assert rc == 0, err
    assert out.startswith("ADMIT") and "2,492,760,064 B" in out


def test_cli_queue_json(capsys):
    rc, out, err = run(["admit", "--budget", "4713MiB", "--kv-bytes-per-token", "32,768", "--request", "18020:8192",
                        "--in-use", "4500MiB", "--queue-ahead", "1", "--durations-s", "70,95,150", "--json"], capsys)
    assert rc == 1, err
    d = json.loads(out)
    assert d["decision"] == "queue" and d["queue_position"] == 2 and d["wait_deadline_s"] == 300.0
    assert d["need_bytes"] == 858_914_816 and d["budget_bytes"] == 4_713 * MiB and d["exit_code"] == 1


def test_cli_reject(capsys):
    rc, out, err = run(["admit", "--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "200000"], capsys)
    assert rc == 1
    assert out.startswith("REJECT (permanent)") and "never" in out


@pytest.mark.parametrize("args", [
    ["--budget", "lots", "--kv-bytes-per-token", "32768", "--request", "10"],
    ["--budget", "4713MiB", "--kv-bytes-per-token", "0", "--request", "10"],
    ["--budget", "4713MiB", "--kv-bytes-per-token", "32768.5", "--request", "10"],
    ["--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "ten"],
    ["--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "10:20:30"],
    ["--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "-5"],
    ["--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "10", "--in-use", "9GiB"],
    ["--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "10", "--durations-s", "1,x"],
    ["--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "10", "--queue-ahead", "-1"],
    ["--kv-bytes-per-token", "32768", "--request", "10"],
])
def test_cli_bad_input(capsys, args):
    rc, out, err = run(["admit", *args], capsys)
    assert rc == 2 and err.strip()
