"""`oomdoctor gate --format github|sarif`: the gate's verdicts in CI's own formats.

GitHub: one workflow command per config (``::error file=F,line=N,title=T::message``, escaped as the runner expects)
and a job-summary Markdown table appended to $GITHUB_STEP_SUMMARY. SARIF: validated against the official SARIF 2.1.0
JSON schema (tests/data/sarif-2.1.0-rtm.5.json, see SARIF_SCHEMA_ORIGIN.md). The exit code is the gate's in every
format."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest

from oomdoctor.gate import formats
from oomdoctor.gate.verdict import ConfigResult, GateResult

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-2.1.0-rtm.5.json").read_text())
DEMO = ROOT / "examples" / "gate-demo"
PROFILES = "models/qwen3-30b-a3b-fp8/serving-profiles.json"


def _validate(log: dict) -> None:
    jsonschema.Draft4Validator(SCHEMA).validate(log)


def _result(root: Path) -> GateResult:
    """Verdicts as run_gate gives them, on a copy of the demo's files (the real vllm.yaml and profiles file)."""
    shutil.copytree(DEMO, root, dirs_exist_ok=True)
    fail = ConfigResult("deploy/vllm.yaml", None, "vllm-config", "modified", "fail", "other_fingerprint",
                        "receipt for another fingerprint: the nearest, receipts/x.yaml attempt 1, differs in 1 setting:",
                        "sha256:" + "f1" * 32, "oomdoctor record --serving-config deploy/vllm.yaml --target nvidia-h200",
                        diff=["settings.max_num_seqs: 64 → 32"])
    prof = ConfigResult(PROFILES, "long-128k", "serving-profiles", "modified", "fail", "no_receipt",
                        "no receipt: no passing real retest on nvidia-h200 for this fingerprint", "sha256:" + "ab" * 32,
                        f"oomdoctor record --serving-config {PROFILES} --profile long-128k --target nvidia-h200",
                        notes=["100%, a, b: escaped"])
    ok = ConfigResult("deploy/serve.sh", None, "serve-script", "modified", "pass", "receipt", "passing retest: r.yaml",
                      "sha256:" + "cd" * 32, None)
    gone = ConfigResult("deploy/old.yaml", None, "vllm-config", "deleted", "pass", "deleted", "deleted", None, None)
    return GateResult("origin/main", "b" * 40, "m" * 40, ".oomdoctor.yaml", [fail, prof, ok, gone], ["a note"])


def _line_of(root: Path, path: str, text: str) -> int:
    return next(i for i, ln in enumerate((root / path).read_text().splitlines(), 1) if text in ln)


def test_locate_points_at_the_changed_setting_and_the_profile(tmp_path):
    res = _result(tmp_path)
    fail, prof = res.configs[0], res.configs[1]
    assert formats.locate(tmp_path, fail) == _line_of(tmp_path, "deploy/vllm.yaml", "max-num-seqs:")
    assert formats.locate(tmp_path, prof) == _line_of(tmp_path, PROFILES, '"long-128k"')


def test_sarif_is_valid_sarif_2_1_0_and_says_what_failed(tmp_path):
    res = _result(tmp_path)
    log = formats.sarif(res, tmp_path, res.exit_code)
    _validate(log)
    run = log["runs"][0]
    assert [r["ruleId"] for r in run["results"]] == ["oomdoctor.gate.other_fingerprint", "oomdoctor.gate.no_receipt"]
    rules = run["tool"]["driver"]["rules"]
    assert all(rules[r["ruleIndex"]]["id"] == r["ruleId"] for r in run["results"])
    loc = run["results"][0]["locations"][0]["physicalLocation"]
    assert loc == {"artifactLocation": {"uri": "deploy/vllm.yaml", "uriBaseId": "%SRCROOT%"},
                   "region": {"startLine": _line_of(tmp_path, "deploy/vllm.yaml", "max-num-seqs:")}}
    assert "settings.max_num_seqs: 64 → 32" in run["results"][0]["message"]["text"]
    assert run["results"][1]["partialFingerprints"] == {"oomdoctorConfigFingerprint/v1": "sha256:" + "ab" * 32}
    assert run["invocations"][0]["exitCode"] == 1


def test_the_schema_check_catches_a_broken_log(tmp_path):
    res = _result(tmp_path)
    log = formats.sarif(res, tmp_path, 1)
    log["runs"][0]["results"][0]["level"] = "fatal"          # not a SARIF level
    with pytest.raises(jsonschema.ValidationError):
        _validate(log)
    del log["version"]
    with pytest.raises(jsonschema.ValidationError):
        _validate(log)


def test_sarif_of_a_passing_gate_has_no_results(tmp_path):
    res = _result(tmp_path)
    res.configs = [c for c in res.configs if c.status == "pass"]
    log = formats.sarif(res, tmp_path, res.exit_code)
    _validate(log)
    assert log["runs"][0]["results"] == [] and log["runs"][0]["properties"]["passed"] is True


def test_github_annotations_are_escaped_workflow_commands(tmp_path):
    res = _result(tmp_path)
    lines = formats.github_annotations(res, tmp_path)
    line = _line_of(tmp_path, "deploy/vllm.yaml", "max-num-seqs:")
    assert lines[0].startswith(f"::error file=deploy/vllm.yaml,line={line},title=oomdoctor gate%3A no passing retest "
                               "(deploy/vllm.yaml)::receipt for another fingerprint")
    assert "%0Asettings.max_num_seqs: 64 → 32%0Ato produce it: oomdoctor record" in lines[0]
    assert lines[1].startswith(f"::error file={PROFILES},line={_line_of(tmp_path, PROFILES, 'long-128k')},")
    assert "note: 100%25, a, b: escaped" in lines[1]                 # % is escaped in the message, , and : are not
    assert lines[2].startswith("::notice file=deploy/serve.sh,line=1,")
    assert lines[3].startswith("::notice file=deploy/old.yaml,title=")   # deleted: no line to point at
    assert lines[4] == "::notice title=oomdoctor gate::a note"
    assert all("\n" not in ln for ln in lines)


def test_job_summary_is_a_markdown_table(tmp_path):
    md = formats.job_summary(_result(tmp_path))
    assert md.startswith("### oomdoctor gate: FAIL\n")
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert rows[0] == "| | config | change | fingerprint | why | to produce it |"
    assert len(rows) == 2 + 4
    assert all(r.count(" | ") - r.count("\\|") == 5 for r in rows[2:])       # six cells each, pipes escaped
    assert "`deploy/vllm.yaml`" in rows[2] and "<br>settings.max_num_seqs: 64 → 32" in rows[2]


# ----------------------------------------------------------------------------- through the CLI, a real git repo
def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                   env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull})


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_cli_formats_on_a_real_repository(tmp_path, monkeypatch, cli):
    repo = tmp_path / "repo"
    shutil.copytree(DEMO, repo)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "-c", "commit.gpgsign=false", "commit", "-qm", "configs")
    cfg = repo / "deploy" / "vllm.yaml"
    cfg.write_text(cfg.read_text().replace("max-num-seqs: 64", "max-num-seqs: 32"))
    monkeypatch.chdir(repo)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    gh = cli("gate", "--format", "github")
    assert gh.rc == 1, gh.err
    first = gh.out.splitlines()[0]
    assert first.startswith(f"::error file=deploy/vllm.yaml,line={_line_of(repo, 'deploy/vllm.yaml', 'max-num-seqs:')},")
    assert gh.out.splitlines()[-1].startswith("gate: FAIL: 1 of 1")
    assert "| ❌ fail | `deploy/vllm.yaml` | modified |" in summary.read_text()
    sa = cli("gate", "--format", "sarif")
    assert sa.rc == 1
    _validate(json.loads(sa.out))
    assert cli("gate", "--json", "--format", "sarif").rc == 2
    cfg.write_text(cfg.read_text().replace("max-num-seqs: 32", "max-num-seqs: 64"))    # back: nothing changed
    ok = cli("gate", "--format", "sarif")
    assert ok.rc == 0 and json.loads(ok.out)["runs"][0]["results"] == []
