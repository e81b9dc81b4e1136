"""The user's whole command with the ONE change (levers/paste.py ``whole_command``), on real logs: read back by THE
vLLM argv reader (serve) or by Python's parser (offline), it is the log's own arguments with exactly the lever's
setting changed; a secret argument never appears; where the card does not know the command, the short form stays."""
from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest

from oomdoctor.card.incident import diagnose_log
from oomdoctor.diagnose.screen import first_screen, launcher_text, paste_lines
from oomdoctor.engines.vllm.argv import find_serve, split_options
from oomdoctor.levers.paste import whole_command
from oomdoctor.redact import MASK

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
SERVED = ["vllm-0.25.1-h200/Eserve_pass.log", "vllm-0.25.1-h200-dawn/S0_serve_free_memory.log",
          "vllm-0.25.1-h200-dawn/S1_serve_runtime.log", "vllm-0.25.1-h200-dawn/S2_serve_runtime_default.log",
          "vllm-0.25.1-h200-dawn/S3_serve_kv_pinned.log", "vllm-0.25.1-h200-morning/G1_serve_capture.log",
          "vllm-0.25.1-h200-morning/W1_serve_warmup.log"]
OFFLINE = ["vllm-0.25.1-h200/A_fail.log", "vllm-0.25.1-h200/B_fail.log", "vllm-0.25.1-h200/D_fail.log",
           "vllm-0.25.1-h200/F1b_fail.log"]


def _card(log: Path) -> dict:
    card, _, _ = diagnose_log(log, no_card=True, no_device=True)
    return dict(card)


def _read_back(line: str) -> tuple[str, dict]:
    toks = shlex.split(line)
    start = find_serve(toks)
    assert start is not None, line
    found, positional = split_options(toks[start:])
    return positional[0], dict(found)


def _setting_levers(card: dict) -> list[dict]:
    return [lv for lv in card["levers"] if lv["id"] not in ("free_other_processes", "larger_gpu")]


@pytest.mark.parametrize("log", SERVED)
def test_a_served_log_gives_back_its_own_arguments_with_one_change(log: str) -> None:
    card = _card(LOGS / log)
    wl = card["workload"]
    own = {**wl["launch_args"], **wl["engine_args"]}
    levers = _setting_levers(card)
    assert levers, log
    for lv in levers:
        lines = whole_command("vllm", wl, lv)
        assert lines is not None, lv
        line = lines[-1]
        env_only = all(k.isupper() for k in lv["change"])
        assert line.startswith("vllm serve ") and (env_only or line.endswith(lv["flag"])), (line, lv)
        model, args = _read_back(line)
        assert model == wl["model"]
        want = {k: v for k, v in own.items() if k not in lv["change"]}
        got = {k: v for k, v in args.items() if k not in lv["change"]}
        assert set(got) == set(want), (line, own)
        for k in want:                        # what the reader gives back is what the log said (as text)
            assert str(got[k]).lower() in (str(want[k]).lower(), shlex.quote(str(want[k])).lower()) \
                or isinstance(want[k], dict), (k, got[k], want[k])
        if not env_only:
            for k, v in lv["change"].items():
                assert str(args[k]).lower() == str(v).lower(), (k, args, lv)
        else:
            assert lines[0] == f"export {lv['flag']}" and len(lines) == 2


@pytest.mark.parametrize("log", OFFLINE)
def test_an_offline_log_gives_back_its_llm_call_with_one_change(log: str) -> None:
    card = _card(LOGS / log)
    wl = card["workload"]
    for lv in _setting_levers(card):
        lines = whole_command("vllm", wl, lv)
        assert lines is not None, lv
        call = ast.parse(lines[-1], mode="eval").body
        assert isinstance(call, ast.Call) and ast.unparse(call.func) == "LLM" and not call.args
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
        if all(k.isupper() for k in lv["change"]):
            assert kwargs == {"model": wl["model"], **wl["engine_args"]}
            continue
        assert kwargs == {"model": wl["model"], **wl["engine_args"], **lv["change"]}, lines
        assert list(kwargs)[-len(lv["change"]):] == list(lv["change"])       # the change last


def _with_args(tmp_path: Path, log: str, extra: str) -> Path:
    """The real log with the user's other arguments in its own non-default args line (vLLM prints every argument
    that differs from its default there, an API key included)."""
    text = (LOGS / log).read_text(encoding="utf-8")
    head, sep, rest = text.partition("non-default args: {")
    assert sep, log
    p = tmp_path / Path(log).name
    p.write_text(head + sep + extra + ", " + rest, encoding="utf-8")
    return p


def test_a_secret_argument_is_never_written_and_the_user_is_told_to_add_it_back(tmp_path: Path) -> None:
    key = "sk-" + "a1B2c3D4" * 4
    log = _with_args(tmp_path, "vllm-0.25.1-h200-dawn/S1_serve_runtime.log",
                     f"'host': '0.0.0.0', 'api_key': ['{key}'], 'served_model_name': ['qwen-8b']")
    card = _card(log)
    assert key not in repr(card)
    lines = launcher_text(card, card["levers"][0])
    assert key not in "\n".join(lines) and MASK not in lines[0]
    model, args = _read_back(lines[0])
    assert args["host"] == "0.0.0.0" and args["served_model_name"] in ("qwen-8b", ["qwen-8b"])
    assert model == "/root/model" and "api_key" not in args
    assert lines[1] == "# add back your own secret arguments, not written here: --api-key"
    screen = "\n".join(first_screen(card, None, 80))
    assert key not in screen and "secret arguments, not written here: --api-key" in screen
    # --json goes through the output's redaction: the note stays readable (it had read "--hf-token ***REDACTED***")
    from oomdoctor.redact import redact_obj
    assert redact_obj({"paste": lines})["paste"] == lines


def test_without_the_users_arguments_the_short_form_stays() -> None:
    # field-guide vllm-v1-024: an engine core's traceback, no arguments line, no launcher: `vllm serve` assumed
    card = _card(LOGS / "field-guide" / "vllm-v1-024.log")
    assert "launch_args" not in card["workload"]
    assert whole_command("vllm", card["workload"], card["levers"][0]) is None
    assert launcher_text(card, card["levers"][0])[0] == "vllm serve MODEL ... --max-num-seqs 64"
    # the arguments known but the launcher assumed: no whole command either
    wl = {**_card(LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log")["workload"], "launcher_assumed": True}
    assert whole_command("vllm", wl, {"id": "enforce_eager", "change": {"enforce_eager": True}}) is None


def test_an_argument_printed_as_an_objects_repr_is_not_written_back() -> None:
    wl = {"launcher": "vllm-serve", "model": "/m", "launch_args": {},
          "engine_args": {"compilation_config": "CompilationConfig(level=3, use_inductor=True)", "max_model_len": 8192}}
    lv = {"id": "max_model_len", "change": {"max_model_len": 4096}}
    assert whole_command("vllm", wl, lv) is None
    wl["engine_args"].pop("compilation_config")
    assert whole_command("vllm", wl, lv) == ["vllm serve /m --max-model-len 4096"]
    # an engine whose table has no `whole` template keeps its flag alone
    assert whole_command("sglang", {**wl, "launcher": "unknown"}, lv) is None


def test_a_long_command_is_continued_between_arguments_and_reads_back_the_same() -> None:
    card = _card(LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log")
    (line,) = launcher_text(card, card["levers"][0])
    for width in (40, 60, 80, 100):
        shown = paste_lines([line], width, "  ")
        assert len(shown) > 1 and all(s.endswith(" \\") for s in shown[:-1])
        # a line wider than the screen holds one argument only (never cut inside one)
        assert all(len(s) <= width or s.count(" --") <= 1 for s in shown), shown
        assert width < 80 or all(len(s) <= width for s in shown), shown
        joined = " ".join(s.strip().removesuffix(" \\") for s in shown)
        assert shlex.split(joined) == shlex.split(line)
    call = "LLM(model='/root/model', max_model_len=32768, gpu_memory_utilization=0.05, kv_cache_memory_bytes=4400000000)"
    shown = paste_lines([call], 60, "  ")
    assert len(shown) == 3 and all(len(s) <= 60 for s in shown) and ast.parse("\n".join(s.strip() for s in shown), mode="eval")


def test_json_gives_each_lever_the_lines_to_paste(cli) -> None:
    r = cli("diagnose", LOGS / "vllm-0.25.1-h200-dawn" / "S1_serve_runtime.log", "--no-device", "--no-card", "--json")
    levers = r.json()["levers"]
    assert levers[0]["paste"][0].startswith("vllm serve /root/model --port 8012 ")
    assert levers[0]["paste"][0].endswith(levers[0]["flag"])
    assert all(isinstance(lv["paste"], list) for lv in levers)


def test_a_command_is_never_cut_inside_a_quoted_value() -> None:
    # a JSON value holding " --" and ", ": a cut there would put a backslash-newline inside the quotes
    line = "vllm serve /m --port 8012 --hf-overrides '{\"note\": \"a --b, c\"}' --max-num-seqs 256 --max-model-len 4096"
    for width in (20, 30, 50):
        shown = paste_lines([line], width, "  ")
        assert shlex.split(" ".join(s.strip().removesuffix(" \\") for s in shown)) == shlex.split(line), shown
        assert any("'{\"note\": \"a --b, c\"}'" in s for s in shown)
    call = "LLM(model='/models/a, b', max_model_len=4096, hf_overrides={'x': 1, 'y': 2})"
    shown = paste_lines([call], 30, "  ")
    assert ast.literal_eval(ast.unparse(ast.parse("\n".join(s.strip() for s in shown), mode="eval").body.keywords[0]
                                        .value)) == "/models/a, b"


def test_the_note_on_secrets_survives_the_outputs_redaction() -> None:
    from oomdoctor.redact import redact_obj

    wl = {"launcher": "vllm-serve", "model": "/m", "launch_args": {"api_key": [MASK], "port": 8000},
          "engine_args": {"hf_token": MASK, "max_model_len": 8192}}
    lines = whole_command("vllm", wl, {"id": "max_model_len", "change": {"max_model_len": 4096}})
    assert lines == ["vllm serve /m --port 8000 --max-model-len 4096",
                     "# add back your own secret arguments, not written here: --api-key, --hf-token"]
    assert redact_obj({"paste": lines})["paste"] == lines
