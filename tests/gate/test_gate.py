"""oomdoctor gate: every serving config that changed against the base needs a passing real retest of its
exact effective config (a receipt, or an incident-card attempt) on one of the declared target devices.

Every test drives a REAL git repository made in a temp folder from examples/gate-demo (which ships a
passing receipt for each of its configs) and calls the CLI in-process, asserting exit code and message.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from oomdoctor import gate as gatemod
from oomdoctor.card import fingerprint as fpmod
from oomdoctor.card import receipt as rcpt
from oomdoctor.cli import main
from oomdoctor.diagnose.read import file_sha256
from oomdoctor.errors import BadInput
from tests.gate.runlog import run_log

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "gate-demo"
PROFILES = "models/qwen3-30b-a3b-fp8/serving-profiles.json"
VLLM_YAML = "deploy/vllm.yaml"
SCRIPT = "deploy/serve.sh"
ENVF = "deploy/serve.env"

pytestmark = [pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"),
              pytest.mark.slow]                                  # every test drives real git subprocesses


def git(repo: Path, *args: str) -> str:
    cp = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                        env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull})
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    r = tmp_path / "repo"
    shutil.copytree(DEMO, r)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    git(r, "init", "-q", "-b", "main")
    git(r, "config", "user.name", "Gate Test")
    git(r, "config", "user.email", "gate@example.com")
    git(r, "config", "commit.gpgsign", "false")
    monkeypatch.chdir(r)
    record_all(r)                                   # a receipt (with its run's log) for every config and profile
    git(r, "add", ".")
    git(r, "commit", "-q", "-m", "serving configs with their receipts")
    return r


def run(*args: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        main(["gate", *args])
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def run_json(*args: str, capsys: pytest.CaptureFixture) -> tuple[int, dict]:
    rc, out, err = run(*args, "--json", capsys=capsys)
    return rc, json.loads(out)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def commit(repo: Path, msg: str, *paths: str) -> None:
    git(repo, "add", *(paths or ["."]))
    git(repo, "commit", "-q", "-m", msg)


def record(repo: Path, path: str, profile: str | None = None, *, outcome: str = "pass", mode: str = "real",
           target: str = "nvidia-h200", version: str | None = None, ec: dict | None = None) -> Path:
    """Write a receipt as `oomdoctor record` does (through the receipt API, with the run's log)."""
    sc = gatemod.load_serving_config(path, profile)
    ec = ec or sc.effective_config
    att = {"outcome": outcome, "engine": {"name": "vllm", "version": version or ec["engine_version"], "mode": mode},
           "target_device": target}
    log = run_log(repo.parent / "runs", {**ec, "engine_version": version or ec["engine_version"]})
    (repo / "receipts").mkdir(exist_ok=True)
    return rcpt.write_receipt(repo / "receipts", ec, att, log=log, source={"path": path, "profile": profile})


def record_all(repo: Path) -> None:
    for sc in gatemod.list_serving_configs():
        record(repo, sc.path, sc.profile)


# ----------------------------------------------------------------------------- the worked example
def test_demo_flow_change_fail_receipt_pass_unrelated_pass(repo, capsys):
    rc, out, _ = run(capsys=capsys)
    assert rc == 0 and "no serving config changed" in out

    edit(repo / PROFILES, '"window": 131072', '"window": 65536')
    rc, out, _ = run(capsys=capsys)
    assert rc == 1
    assert f"FAIL  {PROFILES} [long-128k]  (modified)" in out
    assert "receipt for another fingerprint" in out
    assert "settings.max_model_len: 131072 → 65536" in out
    assert (f"oomdoctor record --serving-config {PROFILES} --profile long-128k --target nvidia-h200") in out
    assert "chat-32k" not in out                                   # the profiles that did not change are not checked

    written = record(repo, PROFILES, "long-128k")
    assert written.parent == repo / "receipts"
    rc, out, _ = run(capsys=capsys)
    assert rc == 0, out
    assert f"PASS  {PROFILES} [long-128k]" in out and "passing retest" in out
    commit(repo, "long profile at 64k, with its retest")

    (repo / "README.md").write_text("unrelated\n")
    edit(repo / "deploy/serve.sh", "# Starts the long-context service.", "# Starts the long-context service (docs).")
    commit(repo, "docs")
    rc, out, _ = run("--base", "HEAD~1", capsys=capsys)
    assert rc == 0, out                                            # serve.sh changed, its fingerprint has a receipt
    (repo / "notes.txt").write_text("x\n")
    rc, data = run_json(capsys=capsys)
    assert rc == 0 and data == {**data, "passed": True, "configs": []}


def test_unchanged_config_and_committed_history(repo, capsys):
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "unrelated.txt").write_text("hello\n")
    commit(repo, "unrelated")
    rc, out, _ = run("--base", "main", capsys=capsys)
    assert rc == 0 and "gate: PASS: no serving config changed" in out


def test_changed_config_without_any_receipt(repo, capsys):
    shutil.rmtree(repo / "receipts")
    commit(repo, "drop receipts")
    edit(repo / VLLM_YAML, "max-num-seqs: 64", "max-num-seqs: 96")
    rc, data = run_json(capsys=capsys)
    assert rc == 1 and data["passed"] is False
    [c] = data["configs"]
    assert c["path"] == VLLM_YAML and c["profile"] is None and c["status"] == "fail"
    assert c["reason_code"] == "no_receipt" and c["reason"].startswith("no receipt")
    assert c["fingerprint"] == gatemod.load_serving_config(VLLM_YAML).fingerprint
    assert c["command"] == f"oomdoctor record --serving-config {VLLM_YAML} --target nvidia-h200"
    assert set(c) >= {"path", "profile", "status", "fingerprint", "reason", "command"}


def test_receipt_for_another_fingerprint_shows_the_diff(repo, capsys):
    edit(repo / VLLM_YAML, "gpu-memory-utilization: 0.90", "gpu-memory-utilization: 0.85")
    edit(repo / VLLM_YAML, "kv-cache-dtype: fp8", "kv-cache-dtype: auto")
    rc, out, _ = run(capsys=capsys)
    assert rc == 1
    assert "receipt for another fingerprint" in out and "differs in 2 settings" in out
    assert "settings.gpu_memory_utilization: 0.9 → 0.85" in out
    assert "settings.kv_cache_dtype: 'fp8' → 'auto'" in out
    rc, data = run_json(capsys=capsys)
    c = data["configs"][0]
    assert c["reason_code"] == "other_fingerprint" and c["receipt"]["path"].startswith("receipts/")
    assert c["diff"] == ["settings.gpu_memory_utilization: 0.9 → 0.85", "settings.kv_cache_dtype: 'fp8' → 'auto'"]


def test_port_only_change_keeps_its_receipt(repo, capsys):
    edit(repo / VLLM_YAML, "port: 8000", "port: 9000")
    rc, data = run_json(capsys=capsys)
    assert rc == 0
    assert [(c["path"], c["status"], c["reason_code"]) for c in data["configs"]] == [(VLLM_YAML, "pass", "receipt")]


def test_stale_receipt_older_engine_version(repo, capsys):
    edit(repo / ".oomdoctor.yaml", 'engine_version: "0.25.1"', 'engine_version: "0.26.0"')
    rc, out, _ = run(capsys=capsys)
    assert rc == 1
    # every config changed through the project file, each with a receipt from the older engine
    assert out.count("FAIL  ") == 5 and "PASS  " not in out
    assert "stale receipt" in out and "recorded with vllm 0.25.1; the engine in use is vllm 0.26.0" in out
    assert "engine_version: '0.25.1' → '0.26.0'" in out
    rc, data = run_json(capsys=capsys)
    assert {c["reason_code"] for c in data["configs"]} == {"stale"}
    # a receipt from the new engine clears one of them
    record(repo, VLLM_YAML)
    rc, data = run_json(capsys=capsys)
    assert rc == 1
    assert {c["path"]: c["status"] for c in data["configs"] if c["profile"] is None}[VLLM_YAML] == "pass"


def test_receipt_from_a_newer_engine_is_not_stale_but_another_fingerprint(repo, capsys):
    edit(repo / ".oomdoctor.yaml", 'engine_version: "0.25.1"', 'engine_version: "0.24.0"')
    rc, data = run_json(capsys=capsys)
    assert rc == 1
    assert {c["reason_code"] for c in data["configs"]} == {"other_fingerprint"}
    assert all(c["diff"] == ["engine_version: '0.25.1' → '0.24.0'"] for c in data["configs"])


def test_valid_receipt_on_a_feature_branch(repo, capsys):
    git(repo, "checkout", "-q", "-b", "feature")
    edit(repo / VLLM_YAML, "max-model-len: 32768", "max-model-len: 40960")
    commit(repo, "longer context")
    rc, out, _ = run("--base", "main", capsys=capsys)
    assert rc == 1 and "settings.max_model_len: 32768 → 40960" in out
    p = record(repo, VLLM_YAML)
    commit(repo, "retest receipt")
    rc, out, _ = run("--base", "main", capsys=capsys)
    assert rc == 0, out
    assert f"PASS  {VLLM_YAML}  (modified)" in out
    assert f"receipts/{p.name} attempt 1 (vllm 0.25.1, real, nvidia-h200, outcome pass" in out
    # the same receipt found through the API
    fp = gatemod.load_serving_config(VLLM_YAML).fingerprint
    [hit] = rcpt.find_passing(repo, fp, ["nvidia-h200"])
    assert hit.path.name == p.name and hit.kind == "receipt"
    assert rcpt.find_passing(repo, fp, ["rtx4090"]) == []


def test_incident_card_attempt_counts_as_a_receipt(repo, capsys):
    edit(repo / VLLM_YAML, "max-num-seqs: 64", "max-num-seqs: 48")
    sc = gatemod.load_serving_config(VLLM_YAML)
    card = {"schema": "oomdoctor.incident/v1", "id": "x", "attempts": [
        {"n": 1, "at": "2026-01-01T00:00:00Z", "lever": "max_num_seqs", "change": {"max_num_seqs": 48},
         "outcome": "pass", "engine": {"name": "vllm", "version": "0.25.1", "mode": "real"},
         "config_fingerprint": sc.fingerprint, "effective_config": sc.effective_config, "target_device": "nvidia-h200"}]}
    (repo / "incidents").mkdir()
    (repo / "incidents" / "2026-kv.yaml").write_text(yaml.safe_dump(card))
    rc, out, _ = run(capsys=capsys)
    assert rc == 1 and "says it passed, but it names no log (log_path): nothing shows that it ran" in out
    runs = repo / "incidents" / "2026-kv.runs"
    runs.mkdir()
    shutil.copy(run_log(repo.parent / "runs", sc.effective_config), runs / "attempt-1.log")
    card["attempts"][0].update(log_path="2026-kv.runs/attempt-1.log", log_sha256=file_sha256(runs / "attempt-1.log"))
    (repo / "incidents" / "2026-kv.yaml").write_text(yaml.safe_dump(card))
    rc, out, _ = run(capsys=capsys)
    assert rc == 0, out
    assert "incidents/2026-kv.yaml attempt 1" in out


@pytest.mark.parametrize("outcome,mode,target,code,text", [
    ("pass", "real", "rtx4090", "wrong_target", "passed on rtx4090"),
    ("pass", "twin", "nvidia-h200", "not_real", "only a twin retest"),
    ("fail", "real", "nvidia-h200", "not_passing", "did not pass (outcome 'fail'"),
    ("predicted_pass", "twin", "nvidia-h200", "not_passing", "did not pass"),
])
def test_attempts_that_do_not_count(repo, capsys, outcome, mode, target, code, text):
    edit(repo / VLLM_YAML, "max-num-seqs: 64", "max-num-seqs: 32")
    record(repo, VLLM_YAML, outcome=outcome, mode=mode, target=target)
    rc, out, _ = run(capsys=capsys)
    assert rc == 1 and text in out
    rc, data = run_json(capsys=capsys)
    assert data["configs"][0]["reason_code"] == code


def test_hand_edited_receipt_does_not_count(repo, capsys):
    """A receipt copied from another config with only its fingerprint changed is not a receipt."""
    edit(repo / VLLM_YAML, "max-num-seqs: 64", "max-num-seqs: 32")
    new_fp = gatemod.load_serving_config(VLLM_YAML).fingerprint
    src = next((repo / "receipts").glob("ad23*.yaml"))
    d = yaml.safe_load(src.read_text())
    d["config_fingerprint"] = new_fp
    for a in d["attempts"]:
        a["config_fingerprint"] = new_fp
    (repo / "receipts" / "forged.yaml").write_text(yaml.safe_dump(d))
    rc, out, _ = run(capsys=capsys)
    assert rc == 1
    assert "receipts/forged.yaml: receipt ignored: its effective_config does not hash to its config_fingerprint" in out


def test_model_revision_and_free_memory_are_part_of_the_fingerprint(repo, capsys):
    edit(repo / ".oomdoctor.yaml", 'model_revision: "c4a1', 'model_revision: "d5b2')
    rc, out, _ = run(capsys=capsys)
    assert rc == 1 and "model_revision: 'c4a1" in out
    git(repo, "checkout", "-q", "--", ".oomdoctor.yaml")
    edit(repo / PROFILES, '"requires_free_bytes": "46GiB"', '"requires_free_bytes": "40GiB"')
    rc, out, _ = run(capsys=capsys)
    assert rc == 1 and "[small-card-8k]" in out and "conditions.requires_free_bytes: 49392123904 → 42949672960" in out


def test_env_file_change_rechecks_the_script(repo, capsys):
    edit(repo / ENVF, "MAX_MODEL_LEN=65536", "MAX_MODEL_LEN=98304")
    rc, out, _ = run(capsys=capsys)
    assert rc == 1
    assert f"FAIL  {SCRIPT}  (modified)" in out and f"changed through {ENVF}" in out
    assert "settings.max_model_len: 65536 → 98304" in out
    git(repo, "checkout", "-q", "--", ENVF)
    edit(repo / ENVF, "PORT=8001", "PORT=8002")                   # not memory-shaping: the old receipt holds
    rc, out, _ = run(capsys=capsys)
    assert rc == 0, out
    edit(repo / ENVF, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF=")
    rc, out, _ = run(capsys=capsys)
    assert rc == 1 and "env.PYTORCH_CUDA_ALLOC_CONF: 'expandable_segments:True' → ''" in out


def test_deleted_config_passes_with_a_note(repo, capsys):
    git(repo, "rm", "-q", VLLM_YAML)
    rc, out, _ = run(capsys=capsys)
    assert rc == 0, out
    assert f"PASS  {VLLM_YAML}  (deleted)" in out and "deleted: nothing to verify" in out
    # also when the entry leaves the project file in the same commit
    cfg = yaml.safe_load((repo / ".oomdoctor.yaml").read_text())
    cfg["configs"] = [c for c in cfg["configs"] if c["path"] != VLLM_YAML]
    (repo / ".oomdoctor.yaml").write_text(yaml.safe_dump(cfg))
    commit(repo, "retire the yaml deployment")
    rc, data = run_json("--base", "HEAD~1", capsys=capsys)
    assert rc == 0
    assert [(c["path"], c["status"], c["change"]) for c in data["configs"]] == [(VLLM_YAML, "pass", "deleted")]


def test_removed_profile_passes_with_a_note(repo, capsys):
    d = json.loads((repo / PROFILES).read_text())
    del d["profiles"]["chat-32k"]
    (repo / PROFILES).write_text(json.dumps(d, indent=2))
    rc, data = run_json(capsys=capsys)
    assert rc == 0
    assert [(c["profile"], c["change"], c["status"]) for c in data["configs"]] == [("chat-32k", "profile_removed", "pass")]


def test_renamed_config(repo, capsys):
    git(repo, "mv", VLLM_YAML, "deploy/vllm-prod.yaml")
    edit(repo / ".oomdoctor.yaml", "path: deploy/vllm.yaml", "path: deploy/vllm-prod.yaml")
    rc, data = run_json(capsys=capsys)
    assert rc == 0, data
    [c] = data["configs"]
    assert c["path"] == "deploy/vllm-prod.yaml" and c["change"] == "renamed" and c["renamed_from"] == VLLM_YAML
    assert c["status"] == "pass" and c["reason_code"] == "receipt"
    # renamed without `git mv` (delete + new untracked file) is still a rename
    git(repo, "reset", "-q", "--hard")
    (repo / VLLM_YAML).rename(repo / "deploy/vllm-b.yaml")
    edit(repo / ".oomdoctor.yaml", "path: deploy/vllm.yaml", "path: deploy/vllm-b.yaml")
    rc, out, _ = run(capsys=capsys)
    assert rc == 0 and "(renamed from deploy/vllm.yaml)" in out
    # renamed AND changed: the old receipt no longer covers it
    edit(repo / "deploy/vllm-b.yaml", "max-num-seqs: 64", "max-num-seqs: 65")
    rc, out, _ = run(capsys=capsys)
    assert rc == 1 and "settings.max_num_seqs: 64 → 65" in out


def test_renamed_config_without_receipt_fails(repo, capsys):
    shutil.rmtree(repo / "receipts")
    commit(repo, "no receipts")
    git(repo, "mv", VLLM_YAML, "deploy/vllm-prod.yaml")
    edit(repo / ".oomdoctor.yaml", "path: deploy/vllm.yaml", "path: deploy/vllm-prod.yaml")
    rc, data = run_json(capsys=capsys)
    assert rc == 1 and data["configs"][0]["reason_code"] == "no_receipt"


def test_new_config_through_a_glob_needs_a_receipt(repo, capsys):
    edit(repo / ".oomdoctor.yaml", "path: deploy/vllm.yaml", "path: deploy/*.yaml")
    commit(repo, "glob")
    (repo / "deploy/canary.yaml").write_text("max-model-len: 16384\n")
    rc, out, _ = run(capsys=capsys)
    assert rc == 1 and "FAIL  deploy/canary.yaml  (added)" in out and "no receipt" not in out.split("why:")[0]
    record(repo, "deploy/canary.yaml")
    rc, out, _ = run(capsys=capsys)
    assert rc == 0, out


def test_staged_and_unstaged_changes_both_count(repo, capsys):
    edit(repo / VLLM_YAML, "max-num-seqs: 64", "max-num-seqs: 32")
    git(repo, "add", VLLM_YAML)
    rc, _, _ = run(capsys=capsys)
    assert rc == 1
    git(repo, "commit", "-q", "-m", "x")
    rc, _, _ = run(capsys=capsys)                                  # base HEAD: nothing uncommitted any more
    assert rc == 0
    rc, _, _ = run("--base", "HEAD~1", capsys=capsys)
    assert rc == 1


# ----------------------------------------------------------------------------- bad input → exit 2, one line
def _bad(capsys, *args) -> str:
    rc, out, err = run(*args, capsys=capsys)
    assert rc == 2, (out, err)
    assert err.startswith("oomdoctor: error: ") and len(err.strip().splitlines()) == 1
    return err


def test_base_ref_that_does_not_exist(repo, capsys):
    err = _bad(capsys, "--base", "origin/nope")
    assert "base ref 'origin/nope' does not exist" in err and "fetch-depth: 0" in err


def test_not_a_git_repository(tmp_path, monkeypatch, capsys):
    d = tmp_path / "plain"
    shutil.copytree(DEMO, d)
    monkeypatch.chdir(d)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert "not a git repository" in _bad(capsys)


@pytest.mark.parametrize("text,field", [
    ("version: 1\nconfigs: [\n", "malformed YAML at line"),
    ("- a\n- b\n", "must be a YAML mapping"),
    ("configs: []\n", "version: required field is missing"),
    ("version: 2\nconfigs: []\n", "version: 2 is not supported"),
    ("version: 1\n", "configs: required field is missing"),
    ("version: 1\nconfigs: []\n", "configs: must be a non-empty list"),
    ("version: 1\nconfig: []\n", "config: unknown field"),
    ("version: 1\nconfigs:\n- {path: deploy/vllm.yaml}\n", "configs[0].kind: required field is missing"),
    ("version: 1\nconfigs:\n- {path: deploy/vllm.yaml, kind: vllm-yaml}\n", "configs[0].kind: 'vllm-yaml' is not one of"),
    ("version: 1\nconfigs:\n- {path: deploy/vllm.yaml, kind: vllm-config, engine: vllm, targets: [h200]}\n",
     "configs[0].engine_version: required field is missing (here or under defaults)"),
    ("version: 1\nconfigs:\n- {path: deploy/vllm.yaml, kind: vllm-config, engine: vllm, engine_version: 0.10, "
     "targets: [h200]}\n", "configs[0].engine_version: YAML read 0.1 as a number; quote it"),
    ("version: 1\nconfigs:\n- {path: deploy/vllm.yaml, kind: vllm-config, engine: tgi, engine_version: '1', "
     "targets: [h200]}\n", "configs[0].engine: 'tgi' is not supported"),
    ("version: 1\ndefaults: {engine: vllm, engine_version: '1', targets: h200}\nconfigs:\n"
     "- {path: deploy/vllm.yaml, kind: vllm-config, target: x}\n", "configs[0].target: unknown field"),
    ("version: 1\ndefaults: {engine: vllm, engine_version: '1', targets: [1]}\nconfigs:\n"
     "- {path: deploy/vllm.yaml, kind: vllm-config}\n", "configs[0].targets: must be a device name"),
    ("version: 1\ndefaults: {engine: vllm, engine_version: '1', targets: h200}\nconfigs:\n"
     "- {path: ../outside.yaml, kind: vllm-config}\n", "configs[0].path: '../outside.yaml' points outside"),
    ("version: 1\ndefaults: {engine: vllm, engine_version: '1', targets: h200}\nconfigs:\n"
     "- {path: deploy/missing.yaml, kind: vllm-config}\n", "configs[0].path: deploy/missing.yaml does not exist"),
    ("version: 1\ndefaults: {engine: vllm, engine_version: '1', targets: h200}\nconfigs:\n"
     "- {path: deploy/vllm.yaml, kind: vllm-config, requires_free_bytes: lots}\n",
     "configs[0].requires_free_bytes: not a memory size"),
    ("version: 1\ndefaults: {engine: vllm, engine_version: '1', targets: h200}\nconfigs:\n"
     "- {path: deploy/serve.sh, kind: serve-script, env_file: deploy/nope.env}\n",
     "configs[0].env_file: deploy/nope.env does not exist"),
])
def test_malformed_project_file(repo, capsys, text, field):
    (repo / ".oomdoctor.yaml").write_text(text)
    err = _bad(capsys)
    assert ".oomdoctor.yaml" in err and field in err, err


def test_missing_project_file(repo, capsys):
    (repo / ".oomdoctor.yaml").unlink()
    assert "no project file at" in _bad(capsys)
    assert "no project file at" in _bad(capsys, "--config", "elsewhere.yaml")


@pytest.mark.parametrize("path,content,reason", [
    (VLLM_YAML, "max-model-len: [32768\n", "deploy/vllm.yaml: malformed YAML at line"),
    (VLLM_YAML, "- max-model-len\n", "must be a YAML mapping of option: value"),
    (VLLM_YAML, "max-model-len: 32768\nmax_model_len: 65536\n", "both set max_model_len, to different values"),
    (VLLM_YAML, "model: meta-llama/Llama-3.1-8B-Instruct\n", "serves model 'meta-llama/Llama-3.1-8B-Instruct' but"),
    (PROFILES, '{"profiles": {"a": {"window": 1}}', "not valid JSON"),
    (PROFILES, '{"nothing": 1}', "no 'profiles'"),
    (PROFILES, '{"schema": "other/v2", "profiles": {}}', "schema 'other/v2'; this oomdoctor reads"),
    (PROFILES, '{"profiles": [{"window": 1}]}', "profiles[0].name: required field is missing"),
    (PROFILES, '{"profiles": [{"name": "a"}, {"name": "a"}]}', "profile 'a' is defined twice"),
    (PROFILES, '{"profiles": {"a": {"requires_free_bytes": "much"}}}', "profiles.a.requires_free_bytes"),
    (PROFILES, '{"profiles": {"a": {"max_num_seqs": 8}}}', "profiles.a.max_num_seqs: unknown field (engine options go under `settings`)"),
    (PROFILES, '{"profiles": {"a": {"settings": {"max-num-seqs": 8}}}}', "not an engine argument name"),
    (PROFILES, '{"profiles": {"a": {"window": 8192, "settings": {"max_model_len": 4096}}}}', "both set max_model_len"),
    (SCRIPT, "vllm serve $MODEL --max-model-len $UNSET_LEN\n", "$UNSET_LEN is not set (not in deploy/serve.env"),
    (SCRIPT, "vllm serve $MODEL --max-model-len $(cat len.txt)\n", "a command substitution ($(...)) cannot be resolved"),
    (SCRIPT, "vllm serve $MODEL --revision main\n", "uses revision 'main' but .oomdoctor.yaml: configs[2].model_revision"),
    (SCRIPT, "echo hello\n", "no `vllm serve` command found"),
    (SCRIPT, "vllm serve $MODEL\nvllm serve $MODEL --max-model-len 1\n", "2 `vllm serve` commands (lines 1, 2)"),
    (SCRIPT, "vllm serve \"$MODEL --port 1\n", "unterminated \" quote"),
    (ENVF, "MODEL=Qwen/Qwen3-30B-A3B-FP8\nthis is not an assignment\n", "deploy/serve.env:2: not a KEY=VALUE line"),
])
def test_config_that_cannot_be_parsed(repo, capsys, path, content, reason):
    (repo / path).write_text(content)
    err = _bad(capsys)
    assert reason in err, err


# ----------------------------------------------------------------------------- serve scripts, robustly
def _script(text: str, env: dict | None = None) -> gatemod.ServeCommand:
    return gatemod.parse_serve_script(text, "serve.sh", env or {}, "serve.env")


def test_serve_script_parsing():
    cmd = _script(
        "#!/usr/bin/env bash\n"
        "set -euo pipefail\n"
        "# vllm serve commented-out --max-model-len 1\n"
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        "LEN=${MAX_LEN:-16384}     # default when the env file does not set it\n"
        "NOT_EXPORTED=1\n"
        "echo \"starting vllm serve on $HOSTNAME\"\n"
        "cd /srv && VLLM_ATTENTION_BACKEND=FLASHINFER exec vllm serve \\\n"
        "    'org/model with space' \\\n"
        "    --max-model-len \"$LEN\" --gpu-memory-utilization=0.85 \\\n"
        "    --enforce-eager --no-enable-prefix-caching \\\n"
        "    -tp 2 --cuda-graph-sizes 1 2 4 \\\n"
        "    --kv-cache-memory-bytes 8G --hf-overrides '{\"a\": 1}' \\\n"
        "    --served-model-name \"$NAME\" --port 8000 \"$@\"\n",
        {"NAME": "m", "HOSTNAME": "h"})
    assert cmd.model == "org/model with space"
    assert cmd.line == 8
    assert cmd.args == {"max_model_len": "16384", "gpu_memory_utilization": "0.85", "enforce_eager": True,
                        "enable_prefix_caching": False, "tensor_parallel_size": "2", "cuda_graph_sizes": ["1", "2", "4"],
                        "kv_cache_memory_bytes": "8G", "hf_overrides": {"a": 1}, "served_model_name": "m", "port": "8000"}
    assert cmd.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert cmd.env["VLLM_ATTENTION_BACKEND"] == "FLASHINFER"
    assert "NOT_EXPORTED" not in cmd.env and "LEN" not in cmd.env
    assert any('"$@"' in n for n in cmd.notes)


@pytest.mark.parametrize("what,text", [
    ("serve script", "vllm serve m --max-model-len " + "${" * 40_000 + "\n"),
    ("env file", "A=a" + " " * 200_000 + "b\n"),
    ("env file", "A=a" + " \t" * 100_000 + "x\n"),
])
def test_serve_scripts_and_env_files_are_read_in_linear_time(what, text):
    """A serving config may be 16 MiB: `${` x 40,000 without a closing brace took 25 s (each `${` scanned the rest
    of the line again), an env line of 20,000 blanks inside its value 4 s (a lazy value before `\\s*$`, and
    `\\s+#.*$` from every blank)."""
    import time

    t0 = time.perf_counter()
    try:
        _script(text) if what == "serve script" else gatemod.parse_env_file(text, "serve.env")
    except BadInput as e:
        assert "closing" in str(e)
    assert time.perf_counter() - t0 < 1.0


def test_env_file_comments_and_blanks_are_cut_as_before():
    got = gatemod.parse_env_file("A=x  # c\nB=\"q r\"  # z\nC=a#b\nD=  v  \nexport E=1 #x\nF=a \t # y\n", "e")
    assert got == {"A": "x", "B": "q r", "C": "a#b", "D": "v", "E": "1", "F": "a"}


def test_serve_script_variables_from_the_env_file_win_over_defaults():
    cmd = _script("exec vllm serve m --max-model-len ${MAX_LEN:-4096} --max-num-seqs ${SEQS-8}\n",
                  {"MAX_LEN": "65536"})
    assert cmd.args == {"max_model_len": "65536", "max_num_seqs": "8"}
    assert cmd.env == {"MAX_LEN": "65536"}                          # the env file is the process environment


def test_serve_script_single_quotes_are_literal_and_escapes_survive():
    cmd = _script("vllm serve m --performance-mode '$NOT_A_VAR' --speculative-config \"{\\\"n\\\": 2}\"\n")
    assert cmd.args["performance_mode"] == "$NOT_A_VAR"
    assert cmd.args["speculative_config"] == {"n": 2}


def test_serve_script_python_module_form_and_flag_before_model():
    cmd = _script("python3 -m vllm.entrypoints.openai.api_server --model org/m --revision abc --max-model-len 8k\n")
    assert (cmd.model, cmd.revision, cmd.args) == ("org/m", "abc", {"max_model_len": "8k"})
    cmd = _script("/opt/venv/bin/vllm serve --trust-remote-code --enforce-eager org/m\n")
    assert cmd.model == "org/m" and cmd.args == {"trust_remote_code": True, "enforce_eager": True}


def test_serve_script_value_with_spaces_from_a_variable_is_split_like_the_shell():
    cmd = _script('EXTRA="--max-num-seqs 4 --enforce-eager"\nvllm serve m $EXTRA\n')
    assert cmd.args == {"max_num_seqs": "4", "enforce_eager": True}
    cmd = _script('MODEL="org/a b"\nvllm serve "$MODEL"\n')
    assert cmd.model == "org/a b"


def test_serve_script_with_config_file(repo):
    (repo / "deploy/base.yaml").write_text("max-model-len: 8192\nmax-num-seqs: 8\n")
    (repo / SCRIPT).write_text("vllm serve $MODEL --config deploy/base.yaml --max-num-seqs 4\n")
    sc = gatemod.load_serving_config(SCRIPT)
    assert sc.effective_config["settings"]["max_model_len"] == 8192
    assert sc.effective_config["settings"]["max_num_seqs"] == 4          # the command line wins
    assert "deploy/base.yaml" in sc.sources


def test_serve_config_changed_through_its_config_file(repo, capsys):
    (repo / "deploy/base.yaml").write_text("max-model-len: 8192\n")
    (repo / SCRIPT).write_text("vllm serve $MODEL --config deploy/base.yaml\n")
    record(repo, SCRIPT)
    commit(repo, "script uses a config file")
    edit(repo / "deploy/base.yaml", "8192", "16384")
    rc, out, _ = run(capsys=capsys)
    assert rc == 1 and "changed through deploy/base.yaml" in out


# ----------------------------------------------------------------------------- receipts API
def test_write_receipt_appends_atomically_and_checks_the_attempt(repo):
    sc = gatemod.load_serving_config(VLLM_YAML)
    ec = sc.effective_config
    att = {"outcome": "pass", "engine": {"name": "vllm", "version": "0.25.1", "mode": "real"}, "target_device": "nvidia-h200"}
    log = run_log(repo.parent / "runs", ec)
    p = rcpt.write_receipt(repo / "r2" / "x.yaml", ec, att, log=log)
    p2 = rcpt.write_receipt(p, ec, {**att, "outcome": "fail"}, log=log)
    assert p == p2
    d = rcpt.read_receipt(p)
    assert d["schema"] == "oomdoctor.receipt/v1" and d["config_fingerprint"] == sc.fingerprint
    assert [a["n"] for a in d["attempts"]] == [1, 2] and [a["outcome"] for a in d["attempts"]] == ["pass", "fail"]
    assert all(a["effective_config"] == ec and a["config_fingerprint"] == sc.fingerprint for a in d["attempts"])
    assert [a["log_path"] for a in d["attempts"]] == ["x.runs/attempt-1.log", "x.runs/attempt-2.log"]
    assert all(file_sha256(p.parent / a["log_path"]) == a["log_sha256"] for a in d["attempts"])
    assert not list(p.parent.glob(".*"))                            # no temp or lock file left behind
    with pytest.raises(BadInput, match="config_fingerprint"):
        rcpt.write_receipt(p, ec, {**att, "config_fingerprint": "sha256:" + "0" * 64}, log=log)
    with pytest.raises(BadInput, match="engine.version"):
        rcpt.write_receipt(p, ec, {**att, "engine": {"name": "vllm", "version": "0.24.0", "mode": "real"}}, log=log)
    with pytest.raises(BadInput, match="target_device"):
        rcpt.write_receipt(p, ec, {k: v for k, v in att.items() if k != "target_device"}, log=log)
    other = {**ec, "settings": {**ec["settings"], "max_num_seqs": 1}}
    with pytest.raises(BadInput, match="one receipt holds one effective config"):
        rcpt.write_receipt(p, other, att, log=run_log(repo.parent / "runs", other))
    with pytest.raises(BadInput, match="the config in its log is not this one"):
        rcpt.write_receipt(p, other, att, log=log)                  # a pass claimed with another config's log
    with pytest.raises(BadInput, match="outcome"):
        rcpt.write_receipt(repo / "r3.yaml", ec, {**att, "outcome": "great"}, log=log)
    with pytest.raises(TypeError):
        rcpt.write_receipt(repo / "r4.yaml", ec, att)               # no receipt without a run  # type: ignore[call-arg]
    with pytest.raises(BadInput, match="does not exist"):
        rcpt.write_receipt(repo / "r4.yaml", ec, {**att, "outcome": "fail"}, log=repo / "no.log")
    assert not (repo / "r4.yaml").exists()
    assert [f.n for f in rcpt.find_passing(repo, sc.fingerprint, ["NVIDIA-H200"], dirs=["r2"])] == [1]


def test_compare_versions():
    c = rcpt.compare_versions
    assert c("0.25.1", "0.26.0") == -1 and c("0.26.0", "0.25.1") == 1 and c("0.25", "0.25.0") == 0
    assert c("0.11.0rc1", "0.11.0") == -1 and c("0.11.0", "0.11.0.post1") == -1 and c("0.10.1+cu128", "0.10.1") == 0
    assert c("0.9.2", "0.10.0") == -1
    assert c("main", "0.1") is None and c(None, "1") is None


def test_pre_commit_hook_definition():
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    [h] = [h for h in hooks if h["id"] == "oomdoctor-gate"]
    assert h["entry"] == "oomdoctor gate" and h["language"] == "python" and h["pass_filenames"] is False


def test_subprocess_entry_point(repo):
    edit(repo / VLLM_YAML, "max-num-seqs: 64", "max-num-seqs: 33")
    cp = subprocess.run([sys.executable, "-m", "oomdoctor", "gate"], cwd=repo, capture_output=True, text=True,
                        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert cp.returncode == 1 and "gate: FAIL" in cp.stdout


def test_config_moved_to_an_undeclared_path_fails(repo, capsys):
    git(repo, "mv", VLLM_YAML, "deploy/other.yml")
    rc, out, _ = run(capsys=capsys)
    assert rc == 1
    assert f"FAIL  {VLLM_YAML}  (renamed)" in out and "renamed to deploy/other.yml, which .oomdoctor.yaml does not declare" in out


def test_profiles_format_is_the_plugins():
    """One serving-profiles format: what the gate fingerprints is what oomdoctor/profiles.py applies."""
    profiles_mod = pytest.importorskip("oomdoctor.profiles")
    path = DEMO / PROFILES
    theirs = {p.name: p for p in profiles_mod.load_profiles(path).profiles}
    ours = gatemod.parse_profiles(path.read_text(), PROFILES)
    assert set(theirs) == set(ours)
    for name, p in theirs.items():
        applied = {**p.settings, "max_model_len": p.window}
        assert fpmod.memory_settings(applied) == fpmod.memory_settings(ours[name].args), name
