"""Every command's exit codes: one table (docs/contract.md = oomdoctor.contract.EXIT_CODES = `oomdoctor --help`), and
the commands do what it says — on real logs, real model configs and the real snapshot."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from oomdoctor import cli as climod
from oomdoctor import contract

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"
MODELS = ROOT / "fixtures" / "models"


def _doc_table() -> dict[str, dict[int, str]]:
    text = (ROOT / "docs" / "contract.md").read_text()
    section = text.split("### Exit codes, every command", 1)[1].split("\n## ", 1)[0]
    out: dict[str, dict[int, str]] = {}
    for cmd, code, meaning in re.findall(r"^\| `([a-z]+)` \| (\d+) \| (.+?) \|$", section, re.M):
        out.setdefault(cmd, {})[int(code)] = meaning
    return out


def test_the_table_covers_every_command_and_says_what_the_code_says() -> None:
    table = _doc_table()
    assert set(table) == set(climod.COMMANDS) == set(contract.EXIT_CODES)
    assert table == contract.EXIT_CODES
    assert all(2 in codes and 0 in codes for codes in table.values())
    assert table["retest"].keys() == {0, 1, 2, 3, 4} and table["diagnose"].keys() == {0, 2, 3}


def test_help_prints_the_table(cli) -> None:
    r = cli("--help")
    assert r.rc == 0
    help_text = " ".join(r.out.split())
    for cmd, codes in contract.EXIT_CODES.items():
        row = " ".join("; ".join(f"{c} {m}" for c, m in codes.items()).split())
        assert f"{cmd} {row}" in help_text, cmd


@pytest.mark.parametrize("log,rc", [("A_fail.log", 0), ("D_fail.log", 0), ("A_pass.log", 3), ("F2_fail.log", 3)])
def test_diagnose(cli, log, rc) -> None:
    assert cli("diagnose", H200 / log, "--no-device", "--no-card").rc == rc


def _plan(cli, *args):
    r = cli("plan", "--json", *args)
    return r.rc, (r.json() if r.rc in (0, 1) else None), r


@pytest.mark.parametrize("args", [
    ["--gpu-memory", "24GiB"],                                                  # fits
    ["--gpu-memory", "8GiB"],                                                   # weights_load_oom
    ["--gpu-memory", "24GiB", "--max-model-len", "1000000"],                    # config_invalid
    ["--gpu-memory", "24GiB", "--free", "10GiB"],                               # free_memory_below_utilization
    ["--gpu-memory", "24GiB", "--kv-cache-memory-bytes", "30000000000"],        # kv_allocation_oom
    ["--gpu-memory", "24GiB", "--gpu-memory-utilization", "0.1"],              # kv_capacity
    ["--gpu-memory", "24GiB", "--max-model-len", "auto"],
    ["--gpu-memory", "rtx4090", "--max-model-len", "8192", "--max-num-seqs", "1024"],
])
def test_plan_exits_1_for_every_does_not_fit_and_0_for_fits(cli, args) -> None:
    rc, res, r = _plan(cli, "--model", MODELS / "llama-3-8b", *args)
    assert rc in (0, 1), r.err
    assert rc == (0 if res["fits"] else 1)
    human = cli("plan", "--model", MODELS / "llama-3-8b", *args)          # the table says the same
    assert human.rc == rc and (("verdict fits" in " ".join(human.out.split())) == res["fits"])
    assert ("verdict does not fit" in " ".join(human.out.split())) == (not res["fits"])


def test_plan_covers_several_failure_classes(cli) -> None:
    seen = set()
    for args in (["8GiB"], ["24GiB", "--free", "10GiB"], ["24GiB", "--gpu-memory-utilization", "0.1"]):
        rc, res, _ = _plan(cli, "--model", MODELS / "llama-3-8b", "--gpu-memory", *args)
        assert rc == 1
        seen.add(res["failure"]["class"])
    assert seen == {"weights_load_oom", "free_memory_below_utilization", "kv_capacity"}


@pytest.mark.parametrize("argv", [["plan", "--model", "/nonexistent", "--gpu-memory", "24GiB"],
                                  ["plan", "--model", str(MODELS / "llama-3-8b"), "--gpu-memory", "lots"],
                                  ["diagnose", "/nonexistent.log"], ["compare", "/nonexistent.log", str(H200 / "A_fail.log")],
                                  ["snapshot", str(ROOT / "README.md")], ["rules", "list", "--rules", "/nonexistent"],
                                  ["record"], ["ladder", "/nonexistent.yaml"], ["retest", "/nonexistent.yaml"],
                                  ["admit", "--budget", "x", "--kv-bytes-per-token", "1", "--request", "1:1"],
                                  ["diagnose"], ["nosuchverb"], ["diagnose", "x.log", "--nosuchflag"],
                                  ["gate", "--format", "xml"], ["retest", "x.yaml", "--engine", "none"]])
def test_bad_input_is_one_line_and_2(cli, argv) -> None:
    r = cli(*argv)
    assert r.rc == 2, (argv, r.err)
    assert "Traceback" not in r.err and r.out == ""
    assert len(r.err_lines) == 1 and r.err.startswith("oomdoctor: error:"), r.err


def test_admit_snapshot_compare_rules(cli) -> None:
    assert cli("admit", "--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "100:100").rc == 0
    assert cli("admit", "--budget", "4713MiB", "--kv-bytes-per-token", "32768", "--request", "150000:8192").rc == 1
    assert cli("snapshot", ROOT / "fixtures" / "snapshots" / "h200_oom.pickle").rc == 0
    assert cli("compare", H200 / "D_pass.log", H200 / "D_fail.log").rc == 0
    assert cli("rules", "list").rc == 0


def test_an_internal_error_is_one_line_and_70(cli, monkeypatch) -> None:
    import oomdoctor.diagnose.report as report

    def boom(*a, **k):
        raise RuntimeError("a bug")

    monkeypatch.setattr(report, "render", boom)
    r = cli("diagnose", H200 / "A_fail.log", "--no-device", "--no-card")
    assert r.rc == contract.EXIT_INTERNAL
    assert r.err_lines == ["oomdoctor: internal error: RuntimeError: a bug (set OOMDOCTOR_DEBUG=1 for the traceback)"]


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["diagnose", str(H200 / "A_fail.log"), "--no-device", "--no-card", "--verbose"],
                                  ["diagnose", str(H200 / "A_fail.log"), "--no-device", "--no-card", "--json"],
                                  ["compare", str(H200 / "D_pass.log"), str(H200 / "D_fail.log")],
                                  ["rules", "list"]])
def test_a_reader_that_leaves_early_is_not_a_failure(argv) -> None:
    """`oomdoctor ... | head -1`: click (EPIPE → exit 1) and rich (stdout → /dev/null, exit 1) both turned it into 1."""
    p = subprocess.Popen([sys.executable, "-m", "oomdoctor", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=ROOT, bufsize=0)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.read(1)
    p.stdout.close()                     # the reader leaves after one byte, before the command has written it all
    err = p.stderr.read().decode()
    assert p.wait() == 0, err
    assert err == ""


@pytest.mark.parametrize("argv", [[], ["rules"]])
def test_a_bare_group_prints_its_help(cli, argv) -> None:
    r = cli(*argv)
    assert r.rc == 0 and r.err == "" and r.out.startswith("Usage: oomdoctor")


def test_a_usage_error_names_the_command_and_its_help(cli) -> None:
    r = cli("diagnose")
    assert r.err_lines == ["oomdoctor: error: oomdoctor diagnose: Missing argument 'LOG' (see oomdoctor diagnose --help)"]


def test_an_error_naming_input_with_line_breaks_is_still_one_line(cli, tmp_path: Path) -> None:
    """Found by the card fuzzer: a field name with a CR in a card split the error line in two."""
    card = tmp_path / "card.yaml"
    card.write_text("schema: oomdoctor.incident/v1\nnumbers: {\"a\\rb\": null}\n")
    for args in (["retest", card, "--dry-run"], ["diagnose", tmp_path / "no\nsuch.log"]):
        r = cli(*args)
        assert r.rc == 2 and len(r.err.splitlines()) == 1 and r.err.startswith("oomdoctor: error: "), r.err


def test_an_error_line_is_redacted_like_every_output(cli) -> None:
    """`--metrics http://admin:hunter2pass@127.0.0.1:1/metrics` printed the password in its error line, and an env
    file's `HF_TOKEN hf_...` line (no `=`) was quoted whole by the gate's error: the error line was not redacted."""
    r = cli("diagnose", H200 / "A_fail.log", "--no-device", "--no-card", "--quiet",
            "--metrics", "http://admin:hunter2pass@127.0.0.1:1/metrics")
    assert r.rc == 2 and "hunter2pass" not in r.err and "***REDACTED***" in r.err, r.err
    from oomdoctor.errors import BadInput
    from oomdoctor.gate.script import parse_env_file

    with pytest.raises(BadInput) as e:
        parse_env_file("HF_TOKEN hf_abcdefghijklmnopqrstuvwxyz12\n", "serve.env")
    assert "hf_abcdefghijklmnopqrstuvwxyz12" not in climod._one_line(e.value)
    assert "12,345 bytes" in climod._one_line("12,345 bytes; api_key=sk1 line 7")         # numbers stay


def test_a_log_given_to_retest_says_to_diagnose_it_first_and_usage_errors_say_oomdoctor_once():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    log = "fixtures/logs/vllm-0.25.1-h200/A_fail.log"
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "retest", "--dry-run", log], cwd=root,
                       capture_output=True, text=True)
    assert r.returncode == 2 and f"run `oomdoctor diagnose {log}` first" in r.stderr
    r = subprocess.run([sys.executable, "-m", "oomdoctor", "fakecmd"], cwd=root, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("oomdoctor: error: No such command 'fakecmd'")
