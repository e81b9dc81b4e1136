"""compare: two real vLLM 0.25.1 start-ups (fixtures/logs/vllm-0.25.1-h200/) lined up row by row; the setting change
the memory arithmetic says explains each ledger difference, with the figures; the cross-version warning."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oomdoctor.analysis.compare import compare, plot
from oomdoctor.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
FX = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
HAS_MPL = importlib.util.find_spec("matplotlib") is not None
NVML_TOTAL = 150_754_820_096


def rows(res: dict, section: str = "ledger") -> dict:
    return {r["name"]: r for r in res[section]}


def expl(res: dict, cause: str) -> dict:
    found = [e for e in res["explanations"] if e["cause"] == cause]
    assert found, [e["cause"] for e in res["explanations"]]
    return found[0]


def test_utilization_explains_kv_available_A_vs_B() -> None:
    res = compare(FX / "A_pass.log", FX / "B_pass.log")
    assert res["same_version"] and not res["warnings"]
    s = rows(res, "settings")["gpu_memory_utilization"]
    assert (s["proven"], s["proven_source"]) == (0.92, "default")           # vLLM 0.25.1's default, not printed
    assert (s["failing"], s["failing_source"]) == (0.25, "explicit")
    assert res["changed_settings"] == ["gpu_memory_utilization"]
    led = rows(res)
    kv = led["kv_available_bytes"]
    assert (kv["proven"], kv["failing"]) == (133_734_544_179, 33_694_018_437)    # 124.55 → 31.38 GiB
    assert kv["delta_exact"] == -100_040_525_742
    assert "-93.17 GiB" in kv["delta"]
    assert kv["explained_by"] == ["gpu_memory_utilization"]
    e = expl(res, "gpu_memory_utilization")
    assert e["status"] == "explained" and e["from"] == 0.92 and e["to"] == 0.25
    assert e["total_bytes"] == NVML_TOTAL
    assert e["predicted_bytes"] == int((0.25 - 0.92) * NVML_TOTAL)               # ≈ (0.92−0.25) × total
    assert e["measured_bytes"] == -100_040_525_742
    assert abs(e["residual_bytes"]) < 0.01 * abs(e["measured_bytes"])
    # the chain: KV bytes → tokens (same 64 KiB per token) → concurrency (tokens / window)
    assert (led["kv_cache_tokens"]["proven"], led["kv_cache_tokens"]["failing"]) == (2_040_672, 514_176)
    assert led["kv_cache_tokens"]["explained_by"] == ["kv_available_bytes"]
    assert led["max_concurrency"]["explained_by"] == ["kv_cache_tokens"]
    assert abs(led["kv_bytes_per_token"]["proven"] - 65_536) < 8 and not led["kv_bytes_per_token"]["changed"]
    # the free memory differs (a ballast) but is a start condition, not something to explain
    assert led["free_before_start_bytes"]["changed"] and "start condition" in led["free_before_start_bytes"]["note"]
    assert res["unexplained"] == []
    assert res["verdict"].startswith("gpu_memory_utilization 0.92 → 0.25 explains KV available 124.55 GiB → 31.38 GiB")


def test_pinned_arena_and_eager_D_vs_F1b() -> None:
    res = compare(FX / "D_pass.log", FX / "F1b_pass.log")
    st = rows(res, "settings")
    assert (st["kv_cache_memory_bytes"]["proven"], st["kv_cache_memory_bytes"]["failing"]) == (3_000_000_000, 4_400_000_000)
    assert (st["enforce_eager"]["proven"], st["enforce_eager"]["failing"]) == (False, True)
    assert set(res["changed_settings"]) == {"kv_cache_memory_bytes", "enforce_eager"}
    led = rows(res)
    arena = led["kv_cache_memory_bytes"]
    assert (arena["proven"], arena["failing"]) == (2_995_739_689, 4_402_341_478)        # 2.79 → 4.1 GiB as printed
    assert arena["explained_by"] == ["kv_cache_memory_bytes"]
    tok = led["kv_cache_tokens"]
    assert (tok["proven"], tok["failing"]) == (45_776, 67_136) and tok["explained_by"] == ["kv_cache_memory_bytes"]
    e = expl(res, "kv_cache_memory_bytes")
    assert e["status"] == "explained"
    assert e["bytes_per_token"] == 65_537                          # 3e9 / 45,776
    assert e["predicted_tokens"] == 67_138 and e["measured_tokens"] == 67_136
    g = led["cuda_graph_bytes"]
    assert (g["proven"], g["failing"]) == (450_971_566, None)      # 0.42 GiB → none
    assert g["explained_by"] == ["enforce_eager"]
    ee = expl(res, "enforce_eager")
    assert ee["status"] == "explained" and "captures no CUDA graphs" in ee["arithmetic"]
    assert led["engine_init_seconds"]["explained_by"] == ["enforce_eager"]
    assert led["max_concurrency"]["explained_by"] == ["kv_cache_tokens"]             # 1.40x → 2.05x
    assert res["unexplained"] == []


def test_batch_budget_A_vs_F2_is_inferred_and_launchers_warned() -> None:
    """A_pass (offline LLM) vs F2_fail (vllm serve): the usage-context default of max_num_batched_tokens
    (16384 vs 8192) is the only setting that differs; KV available grows by what the activation peak shrank."""
    res = compare(FX / "A_pass.log", FX / "F2_fail.log")
    assert res["changed_settings"] == ["max_num_batched_tokens"]
    assert any("different launchers (vllm-llm vs vllm-serve)" in w for w in res["warnings"])
    kv = rows(res)["kv_available_bytes"]
    assert kv["delta_exact"] == 118_111_601 and kv["explained_by"] == ["max_num_batched_tokens"]
    e = expl(res, "max_num_batched_tokens")
    assert e["status"] == "inferred" and e["measured_bytes"] == 118_111_601
    assert "not printed" in e["arithmetic"]                        # said honestly: 0.25.1 prints no activation peak


def test_pinned_batch_budget_change_does_not_move_kv() -> None:
    res = compare(FX / "Eserve_pass.log", FX / "E_pass.log")
    assert res["changed_settings"] == ["max_num_batched_tokens"]
    assert not rows(res)["kv_cache_tokens"]["changed"]
    assert "pinned on both starts" in expl(res, "max_num_batched_tokens")["arithmetic"]


@pytest.mark.parametrize("proven,failing,klass,cause,text", [
    ("B_pass", "B_fail", "free_memory_below_utilization", "gpu_memory_utilization", "free 39.49 GiB < gpu_memory_utilization 0.92"),
    ("F1b_pass", "F1b_fail", "cuda_graph_oom", "enforce_eager", "captures none"),
    ("D_pass", "D_fail", "kv_allocation_oom", "kv_cache_memory_bytes", "4.88 GiB left, less than the arena"),
    ("A_pass", "A_fail", "kv_capacity", "max_model_len", "needs 244.14 GiB of KV"),
])
def test_the_failure_is_explained(proven: str, failing: str, klass: str, cause: str, text: str) -> None:
    res = compare(FX / f"{proven}.log", FX / f"{failing}.log")
    assert res["outcome"] == {"proven": "unknown", "failing": klass, "explained_by": [cause]}
    e = [x for x in res["explanations"] if "outcome" in x["explains"]][0]
    assert e["status"] == "explained" and text in e["arithmetic"]
    # the rows the failing start never printed (it died first) are not "unexplained differences"
    assert res["unexplained"] == []
    assert res["verdict"] == e["arithmetic"] or res["verdict"].startswith(e["arithmetic"])


def test_same_log_twice_changes_nothing() -> None:
    res = compare(FX / "D_pass.log", FX / "D_pass.log")
    assert res["changed_settings"] == [] and res["unexplained"] == [] and res["explanations"] == []
    assert not any(r["changed"] for r in res["ledger"])
    assert res["verdict"] == "no setting differs between the two starts"


def test_cross_version_warns_and_compares_only_stable_rows(tmp_path: Path) -> None:
    # TEST TRANSFORMATION (not a real log): B_pass.log with its version line edited from v0.25.1 to v0.24.0,
    # to stand for a start-up of another engine version.
    text = (FX / "B_pass.log").read_text()
    assert text.count("LLM engine (v0.25.1)") == 1
    other = tmp_path / "B_pass_as_v0.24.0.log"
    other.write_text(text.replace("LLM engine (v0.25.1)", "LLM engine (v0.24.0)"))
    res = compare(FX / "A_pass.log", other)
    assert res["proven"]["engine_version"] == "0.25.1" and res["failing"]["engine_version"] == "0.24.0"
    assert not res["same_version"]
    assert res["warnings"][0].startswith("different engine versions (vllm 0.25.1 vs 0.24.0): only the version-stable rows")
    led = rows(res)
    for name in ("kv_available_bytes", "cuda_graph_bytes", "engine_init_seconds"):
        assert led[name]["aligned"] is False and led[name]["changed"] is False and led[name]["delta"] == ""
    for name in ("weights_bytes", "kv_cache_tokens", "max_concurrency", "free_before_start_bytes"):
        assert led[name]["aligned"] is True
    assert "KV available (profiled budget)" in res["not_aligned"]
    # the utilization arithmetic needs KV available, which is not aligned across versions: not claimed
    assert expl(res, "gpu_memory_utilization")["status"] == "qualitative"
    assert "kv_cache_tokens" in res["unexplained"]
    # a default whose value neither log prints is not compared across versions
    st = rows(res, "settings")
    assert st["max_num_seqs"]["aligned"] is False


@pytest.mark.slow
def test_cli_json_and_table() -> None:
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "compare", str(FX / "D_pass.log"), str(FX / "F1b_pass.log"), "--json"],
                       capture_output=True, text=True, env=e, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert set(j["changed_settings"]) == {"kv_cache_memory_bytes", "enforce_eager"}
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "compare", str(FX / "A_pass.log"), str(FX / "B_pass.log")],
                       capture_output=True, text=True, env=dict(e, COLUMNS="200"), cwd=ROOT, timeout=60)
    assert r.returncode == 0 and "gpu_memory_utilization 0.92 → 0.25 explains KV available" in r.stdout
    assert "Ledger" in r.stdout and "Settings" in r.stdout
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "compare", str(FX / "nope.log"), str(FX / "B_pass.log")],
                       capture_output=True, text=True, env=e, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = compare(FX / "A_pass.log", FX / "B_pass.log")
    for m in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # import matplotlib → ImportError
    with pytest.raises(BadInput, match=r"--plot needs matplotlib: pip install 'oomdoctor\[plot\]'"):
        plot(res, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib is not installed (optional extra 'plot')")
def test_plot_writes_a_png(tmp_path: Path) -> None:
    res = compare(FX / "D_pass.log", FX / "F1b_pass.log")
    out = plot(res, tmp_path / "ledgers.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
