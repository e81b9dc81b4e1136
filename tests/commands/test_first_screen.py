"""The first screen of `oomdoctor diagnose` at 80 columns: what failed, in which phase, why, and the ONE change as
the launcher takes it, within 24 lines, no line wider than 80, no number split across lines — on every real log and
every log rendered from an engine's own format strings. The rest is behind --verbose."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from oomdoctor.card.incident import diagnose_log
from oomdoctor.diagnose.report import render
from oomdoctor.diagnose.screen import HEIGHT, first_screen, wrap
from oomdoctor.units import human_bytes

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
FIXTURES = sorted(LOGS.glob("vllm-0.25.1-h200/*.log")) + sorted(LOGS.glob("*-formatstrings/*.log")) \
    + sorted(LOGS.glob("field-guide/*.log"))
WIDTH = 80


def _card(log: Path) -> dict:
    card, _, _ = diagnose_log(log, no_card=True, no_device=True)
    return dict(card)


def _numbers(card: dict) -> set[str]:
    """Every figure the screen may show, as it may show it: raw, with thousands separators, as bytes with unit."""
    vals: list[tuple[str, object]] = list(card["numbers"].items())
    for lv in card["levers"][:1]:
        vals += list(lv["change"].items()) + list(lv["predicted"].items())
    out = set()
    for k, v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out.update({str(v), f"{v:,}"} if isinstance(v, int) else {str(v)})
        if k.endswith("_bytes"):
            out.add(human_bytes(v))
    return {s for s in out if len(s) >= 4}


def split_numbers(lines: list[str], numbers: set[str]) -> list[str]:
    """The numbers that appear in the text only when lines are joined: they were split at a line end."""
    stripped = [ln.strip() for ln in lines]
    joined_tight, joined_spaced = "".join(stripped), " ".join(stripped)
    return sorted(n for n in numbers if (n in joined_tight or n in joined_spaced) and not any(n in ln for ln in lines))


def test_the_checker_sees_a_split_number() -> None:
    # what the old lever table printed at 80 columns: "max_model_len=19" / "98848"
    assert split_numbers(["max_model_len=19", "98848"], {"1998848"}) == ["1998848"]
    assert split_numbers(["KV 244.14", "GiB needed"], {"244.14 GiB"}) == ["244.14 GiB"]
    assert split_numbers(["max_model_len=1998848"], {"1998848"}) == []


def test_wrap_keeps_numbers_and_units_whole() -> None:
    text = "tokens that fit = 124.52 GiB x (1 - 0.02) / 65,536 B = 1,999,338 (capped at vLLM's estimate 2,040,160)"
    for width in range(20, 90):
        lines = wrap(text, width)
        assert all(len(ln) <= width for ln in lines), width
        assert split_numbers(lines, {"124.52 GiB", "65,536 B", "1,999,338", "2,040,160"}) == [], (width, lines)
        assert " ".join(lines).split() == text.split()


def test_wrap_cuts_an_overlong_word_but_not_a_number() -> None:
    url = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/" * 2
    lines = wrap(f"See {url} for 1234567890123", 40)
    assert all(len(ln) <= 40 for ln in lines) and "…" in lines[1] and lines[-1].endswith("1234567890123")


@pytest.mark.parametrize("log", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_first_screen_fits_and_answers(log: Path) -> None:
    card = _card(log)
    lines = first_screen(card, "incidents/x.yaml", WIDTH)
    assert len(lines) <= HEIGHT, "\n".join(lines)
    assert max(len(ln) for ln in lines) <= WIDTH, "\n".join(ln for ln in lines if len(ln) > WIDTH)
    assert split_numbers(lines, _numbers(card)) == [], "\n".join(lines)
    c = card["classification"]
    assert lines[0].startswith(f"{c['class']} · phase {c['phase']}")
    if card["levers"]:
        lever = card["levers"][0]
        # a setting by its name; freeing the GPU in words ("stop process 2115, which holds the GPU's memory")
        title = "Change ONE thing: stop " if lever["id"] == "free_other_processes" else f"Change ONE thing: {lever['id']}"
        assert any(ln.startswith(title) for ln in lines)
        if card["evidence"]:
            assert any(ln.startswith(f"Evidence (line {card['evidence'][0]['line']}") or ln.startswith("Evidence (line")
                       for ln in lines)
    assert lines[-1].endswith("--verbose")


def test_a_fail_the_change_is_the_offline_kwarg_with_its_exact_value() -> None:
    lines = first_screen(_card(LOGS / "vllm-0.25.1-h200" / "A_fail.log"), "incidents/a.yaml", WIDTH)
    text = "\n".join(lines)
    assert lines[-2:] == ["Next: oomdoctor retest incidents/a.yaml", "More (5 levers, numbers, ledger, device): --verbose"]
    assert "Change ONE thing: max_model_len 4,000,000 → 1,998,848" in lines
    # the log's start was an offline LLM(...) call, whose arguments its "non-default args" line gives: the whole call
    assert "  LLM(model='/root/model', max_model_len=1998848)" in lines
    assert "Evidence (line 57, EngineCore pid=1098):" in lines
    assert "(EngineCore pid=1098) ERROR" not in text          # the message, not its logging header
    assert "aligned down to a multiple of 1024: 1,998,848" in text


def test_a_served_start_gets_its_whole_vllm_serve_command_with_the_flag_last() -> None:
    card = _card(LOGS / "vllm-0.25.1-h200" / "Eserve_pass.log")
    lever = card["levers"][0]
    (setting, value), = lever["change"].items()
    flag = "--" + setting.replace("_", "-") + f" {value}"
    lines = first_screen(card, None, WIDTH)
    i = lines.index("  vllm serve /root/model --port 8012 --max-model-len 32768 --max-num-seqs 64 \\")
    assert lines[i + 1] == f"    {flag}" and all(len(ln) <= WIDTH for ln in lines)


def test_a_paste_without_its_launcher_gets_the_serve_flag_and_the_offline_form_beside_it() -> None:
    # field-guide vllm-v1-024: an engine core's traceback and the sampler's message; neither the API server's lines
    # nor the offline API's show which launcher ran it. `vllm serve` is assumed, and said to be
    card = _card(LOGS / "field-guide" / "vllm-v1-024.log")
    assert (card["workload"]["launcher"], card["workload"]["launcher_assumed"]) == ("vllm-serve", True)
    lines = first_screen(card, None, WIDTH)
    i = lines.index("  vllm serve MODEL ... --max-num-seqs 64")
    assert lines[i + 1] == "  LLM(..., max_num_seqs=64)     # the offline API"


@pytest.mark.parametrize("log, launcher", [
    ("vllm-0.25.1-h200/A_fail.log", "vllm-llm"),            # the offline API's frames (entrypoints/llm.py)
    ("vllm-0.25.1-h200/A_pass.log", "vllm-llm"),            # its "Processed prompts" bar
    ("vllm-0.25.1-h200-dawn/S1_serve_runtime.log", "vllm-serve"),   # the API server's lines
])
def test_a_launcher_the_log_shows_is_not_assumed(log: str, launcher: str) -> None:
    wl = _card(LOGS / log)["workload"]
    assert wl["launcher"] == launcher and "launcher_assumed" not in wl


def test_a_long_serve_line_is_continued_not_wrapped() -> None:
    card = _card(LOGS / "vllm-0.33.0-formatstrings" / "kv_preemption.log")
    lines = first_screen(card, None, WIDTH)
    i = lines.index("  vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 256 \\")
    assert lines[i + 1] == "    --kv-cache-memory-bytes 17179869184"


def test_no_memory_failure_says_so_without_a_lever() -> None:
    card = _card(LOGS / "vllm-0.25.1-h200" / "A_pass.log")
    lines = first_screen(card, "incidents/x.yaml", WIDTH)
    assert lines[0].startswith("unknown · phase none")
    assert not any(ln.startswith("Change ONE thing") for ln in lines)
    assert "card: incidents/x.yaml" in lines


def test_verbose_shows_every_lever_and_number_without_python_reprs() -> None:
    card = _card(LOGS / "vllm-0.25.1-h200" / "A_fail.log")
    from oomdoctor.levers.modelcheck import check

    check(card, str(LOGS.parent / "models" / "gpukit-llama-886m"), None)     # what --model adds
    short, full = io.StringIO(), io.StringIO()
    render(card, None, file=short, width=WIDTH)
    render(card, None, file=full, verbose=True, width=WIDTH)
    head, more = short.getvalue().rsplit("More (", 1)       # --verbose drops "More (...): --verbose": it follows
    assert full.getvalue().startswith(head) and more.endswith(": --verbose\n") and "More (" not in full.getvalue()
    out = full.getvalue()
    for lv in card["levers"]:
        assert re.search(rf"^    #{lv['rank']} {lv['id']}\b", out, re.M), lv["id"]
    assert "{'" not in out and "True" not in out.replace("=True", "")       # no raw dict, no Python bool
    assert "model: fits yes, kv_tokens 2,041,760" in out
    assert all(len(ln) <= WIDTH for ln in out.splitlines())
    assert split_numbers(out.splitlines(), {"1998848", "264945795072"}) == []


def test_the_cli_prints_the_first_screen_and_verbose_the_rest(cli, tmp_path) -> None:
    log = LOGS / "vllm-0.25.1-h200" / "B_fail.log"
    short = cli("diagnose", log, "--no-device", "--out", tmp_path / "b.yaml")
    full = cli("diagnose", log, "--no-device", "--out", tmp_path / "b.yaml", "--verbose")
    assert short.rc == full.rc == 0
    assert len(short.out.splitlines()) <= HEIGHT
    assert "  LLM(model='/root/model', max_model_len=32768, gpu_memory_utilization=0.27)" in short.out.splitlines()
    card = str(tmp_path / "b.yaml")
    assert len("Next: oomdoctor retest " + card) > WIDTH           # a long path goes whole on its own line
    assert f"Next: oomdoctor retest \\\n  {card}\n" in short.out
    assert "Levers (try #1 first; one at a time):" in full.out and "Levers (try" not in short.out


def test_the_readme_shows_the_real_first_screen() -> None:
    readme = (LOGS.parents[1] / "README.md").read_text()
    shown = readme.split("What the first command prints", 1)[1].split("```\n", 2)[1]
    card = _card(LOGS / "vllm-0.25.1-h200" / "A_fail.log")
    assert shown.splitlines() == first_screen(card, "/tmp/oomdoctor-card.yaml", WIDTH)


@pytest.mark.parametrize("args", [["--gpu-memory", "24GiB", "--free", "10GiB"], ["--gpu-memory", "8GiB"],
                                  ["--gpu-memory", "h200", "--max-model-len", "8192"]])
def test_plan_table_fits_80_columns_without_cutting_a_number(cli, monkeypatch, args) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    model = LOGS.parent / "models" / "llama-3-8b"
    r = cli("plan", "--model", model, *args)
    res = cli("plan", "--model", model, *args, "--json").json()
    lines = r.out.splitlines()
    assert all(len(ln) <= WIDTH for ln in lines), r.out
    figures = {f"{res[k]:,}" for k in ("kv_tokens", "kv_bytes_per_token", "max_model_len_that_fits") if res[k] >= 1000}
    figures |= {human_bytes(res["weights_bytes"]), human_bytes(res["available_kv_bytes"])}
    assert split_numbers(lines, figures) == [] and all(any(f in ln for ln in lines) for f in figures), r.out


def test_phase_basis_confidence_and_where_the_root_cause_is() -> None:
    card = _card(LOGS / "vllm-0.25.1-h200" / "A_fail.log")
    card["classification"].update(phase_basis="message", confidence="high",
                                  root_cause_in="the EngineCore process's output (its stderr)")
    lines = first_screen(card, "incidents/a.yaml", WIDTH)
    assert lines[0] == "kv_capacity · phase kv_reservation (message, confidence high) · vllm 0.25.1"
    assert any(ln.startswith("The root cause is not in this log. Fetch the EngineCore") for ln in lines)


def test_the_worst_case_gives_up_arithmetic_and_evidence_never_the_change() -> None:
    card = _card(LOGS / "vllm-0.25.1-h200" / "A_fail.log")
    card["classification"].update(phase_basis="milestones", confidence="medium",
                                  root_cause_in="the output of every worker process, rank 0 first " * 3)
    card["summary"] = card["summary"] * 4
    card["workload"]["launcher"] = "vllm-serve"
    card["workload"]["model"] = "/models/" + "a-very-long-model-directory-name/" * 2
    card["levers"][0]["arithmetic"] *= 4
    card["levers"][0]["cost"] *= 3
    lines = first_screen(card, "/var/lib/oomdoctor/incidents/" + "x" * 60 + ".yaml", WIDTH)
    assert len(lines) == HEIGHT, "\n".join(lines)
    why = lines.index("Why:")
    assert lines[why + 1:why + 4] == ["  · KV per token = 244.14 GiB / 4,000,000 = 65,536 B",
                                      "  · tokens that fit = 124.52 GiB x (1 - 0.02) / 65,536 B = 1,999,338 (within",
                                      "  … (the rest: --verbose)"]         # _fit took one more line of arithmetic
    i = lines.index("Change ONE thing: max_model_len 4,000,000 → 1,998,848")
    assert lines[i + 1].endswith(" \\") and lines[i + 2].endswith(" --max-model-len 1998848")
    assert lines[-3:-1] == ["Next: oomdoctor retest \\", "  /var/lib/oomdoctor/incidents/" + "x" * 60 + ".yaml"]


def test_what_a_prediction_leaves_out_is_on_the_first_screen() -> None:
    # C2: freeing the co-tenant "fits" the weights' load, but the explicit utilization of 0.005 cannot hold them
    lines = first_screen(_card(LOGS / "vllm-0.25.1-h200" / "C2_fail.log"), None, WIDTH)
    text = " ".join(lines)
    assert "But: your explicit gpu_memory_utilization=0.005 gives a budget of 715.78 MiB" in text
    assert len(lines) <= HEIGHT and max(len(ln) for ln in lines) <= WIDTH


def test_a_scripts_own_llm_line_says_the_offline_api(tmp_path: Path) -> None:
    # the user's frame and its line 'llm = LLM(...)' above vLLM's sampler message (its wording: the field guide's
    # vllm-v1-024): the offline API, not assumed
    p = tmp_path / "script.log"
    p.write_text('  File "run.py", line 3, in <module>\n    llm = LLM(model="x")\n'
                 + _line_of(LOGS / "field-guide" / "vllm-v1-024.log", "warming up sampler") + "\n", encoding="utf-8")
    wl = _card(p)["workload"]
    assert wl["launcher"] == "vllm-llm" and "launcher_assumed" not in wl


def _line_of(log: Path, text: str) -> str:
    line = next(t for t in log.read_text(encoding="utf-8").splitlines() if text in t)
    return line[line.index("RuntimeError"):]


def test_the_command_a_paste_quotes_gives_the_model_the_settings_and_the_launcher() -> None:
    # field-guide vllm-v1-014: '$ python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-8B
    # --gpu-memory-utilization 0.4' above "No available memory for the cache blocks": the lever had assumed 0.92
    card = _card(LOGS / "field-guide" / "vllm-v1-014.log")
    wl = card["workload"]
    assert (wl["launcher"], wl["model"], wl["engine_args"]) == ("vllm-serve", "Qwen/Qwen3-8B",
                                                              {"gpu_memory_utilization": 0.4})
    assert "launcher_assumed" not in wl
    lines = first_screen(card, None, WIDTH)
    assert "Change ONE thing: gpu_memory_utilization 0.4 → 0.45" in lines       # the explicit low value: the cause
    assert "  vllm serve Qwen/Qwen3-8B --gpu-memory-utilization 0.45" in lines      # the quoted command, changed


def test_the_engines_own_arguments_line_wins_over_a_quoted_command(tmp_path: Path) -> None:
    src = (LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log").read_text(encoding="utf-8")
    p = tmp_path / "s1.log"
    p.write_text("$ vllm serve /other/model --max-num-batched-tokens 1024\n" + src, encoding="utf-8")
    wl = _card(p)["workload"]
    assert wl["model"] == "/root/model" and wl["engine_args"]["max_num_batched_tokens"] == 65536
    # a quoted command that does not read as one (an unbalanced quote) is no command
    q = tmp_path / "q.log"
    q.write_text("$ vllm serve '/m --max-model-len 4096\n" + _line_of(LOGS / "field-guide" / "vllm-v1-024.log",
                                                                      "warming up sampler") + "\n", encoding="utf-8")
    assert _card(q)["workload"].get("launcher_assumed") is True
