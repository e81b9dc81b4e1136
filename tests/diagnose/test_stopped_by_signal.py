"""An engine stopped by a signal (vLLM's "[shutdown] EngineCore: trigger received signal=SIGINT") prints wrappers
while it shuts down: they are no failure (diagnose/ignored.py drop_after_stop). A real served retest on the H200
printed them after serving its request; the diagnosis had said cascade_only and the attempt was lost."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.card.incident import diagnose_log

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
STOPPED = LOGS / "vllm-0.25.1-h200-afternoon" / "W1_try1_served_then_stopped.log"


def _card(log: Path) -> dict:
    card, _, _ = diagnose_log(log, no_card=True, no_device=True)
    return dict(card)


def test_a_served_run_stopped_by_a_signal_is_clean() -> None:
    card = _card(STOPPED)
    c = card["classification"]
    assert (c["class"], c["phase"]) == ("unknown", "none") and "root_cause_in" not in c
    assert not any(e.get("role") in ("root", "cascade") for e in card["evidence"])
    assert "the engine was stopped by a signal (SIGINT) at line 94" in " ".join(card["notes"])
    assert card["summary"] == "the engine started and served; no memory failure in the log"


def test_a_pasted_tail_of_a_ctrl_c_is_not_a_missing_root_cause(tmp_path: Path) -> None:
    # what a user pastes after pressing Ctrl-C on `vllm serve`: the signal, the shutdown, the output handler's error
    lines = STOPPED.read_text(encoding="utf-8").split("\n")
    tail = tmp_path / "tail.log"
    tail.write_text("\n".join(lines[93:116]) + "\n", encoding="utf-8")
    assert "EngineDeadError" in tail.read_text()
    c = _card(tail)["classification"]
    assert c["class"] == "unknown" and "root_cause_in" not in c
    # the same wrappers without the signal line: the root cause is elsewhere (cascade_only), as before
    no_signal = tmp_path / "no_signal.log"
    no_signal.write_text("\n".join(ln for ln in lines[93:116] if "[shutdown]" not in ln) + "\n", encoding="utf-8")
    assert _card(no_signal)["classification"]["class"] == "cascade_only"


def test_a_memory_failure_before_the_stop_stays_the_root(tmp_path: Path) -> None:
    oom = (LOGS / "vllm-0.25.1-h200-morning" / "W1_serve_warmup.log").read_text(encoding="utf-8")
    stop = [ln for ln in STOPPED.read_text(encoding="utf-8").split("\n") if "[shutdown]" in ln]
    p = tmp_path / "oom_then_stop.log"
    p.write_text(oom + "\n".join(stop) + "\n", encoding="utf-8")
    c = _card(p)["classification"]
    assert (c["class"], c["phase"]) == ("sampler_warmup_oom", "warmup")
