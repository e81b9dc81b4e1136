"""Which runtime signal decides a serving log without a root failure: counted preemptions, then requests the server
refused, then KV saturation inferred from stats lines (held-out set 14: two 400s for prompts over the window, under a
cache at 99-100 % with requests waiting, were called kv_preemption). Real logs: vllm-0.25.1-h200/Eserve_pass.log (KV
pressure inferred from its stats lines) and F2_client.txt (the server's 400 body for a prompt over the window)."""
from __future__ import annotations

from pathlib import Path

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules

H200 = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-0.25.1-h200"
RULES = default_rules()


def test_pressure_alone_is_kv_preemption_inferred():
    d = diagnose_file(H200 / "Eserve_pass.log", RULES)
    assert (d.klass, d.rule) == ("kv_preemption", "runtime.kv_pressure.inferred")


def test_a_refusal_under_a_saturated_cache_is_the_rejection_and_says_the_cache_was_saturated(tmp_path):
    refusal = next(ln for ln in (H200 / "F2_client.txt").read_text(encoding="utf-8").splitlines()
                   if "maximum context length" in ln)
    p = tmp_path / "serve.log"
    p.write_text((H200 / "Eserve_pass.log").read_text(encoding="utf-8") + refusal + "\n", encoding="utf-8")
    d = diagnose_file(p, RULES)
    assert (d.klass, d.rule) == ("admission_rejection", "vllm.runtime.prompt_too_long")
    assert "also saturated while requests waited" in d.phase_basis
    assert d.numbers["kv_pressure_samples_count"] >= 1 and d.numbers["rejected_requests_count"] == 1
