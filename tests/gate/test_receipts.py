"""Receipts the gate can verify (issue 16, item 2), on the REAL H200 retests of incidents/h200-D_fail.yaml.

A serving config equal to the D incident's passing attempt 2 (``max_model_len`` 32768, ``gpu_memory_utilization``
0.05, ``kv_cache_memory_bytes`` 3355443200, ``VLLM_USE_FLASHINFER_SAMPLER=0``) is proven by that attempt's own log;
a 10-line forged receipt, a tampered log, a failing run's log and another config's log are not. Optional SSH
signatures (``ssh-keygen -Y``), and a config taken out of the project file while its file stays, FAIL.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from oomdoctor.card import receipt as rcpt
from oomdoctor.cli import main
from oomdoctor.diagnose.read import file_sha256
from oomdoctor.errors import BadInput
from oomdoctor.gate import load_serving_config
from oomdoctor.gate.signing import sign

ROOT = Path(__file__).resolve().parents[2]
INC = ROOT / "incidents"
D_PASS = INC / "h200-D_fail.runs" / "attempt-2-kv_cache_memory_bytes.log"      # served, clean
D_FAIL = INC / "h200-D_fail.runs" / "attempt-1-none.log"                         # kv_allocation_oom
A_PASS = INC / "h200-A_fail.runs" / "attempt-2-max_model_len.log"                # another config, served

pytestmark = [pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed"), pytest.mark.slow]

PROJECT = """version: 1
defaults: {engine: vllm, engine_version: "0.25.1", model: /root/model, targets: [nvidia-h200]}
configs:
  - {path: deploy/vllm.yaml, kind: vllm-config, env_file: deploy/vllm.env}
  - {path: deploy/other.yaml, kind: vllm-config}
"""
CONFIG = "max-model-len: 32768\ngpu-memory-utilization: 0.05\nkv-cache-memory-bytes: {kv}\nport: 8000\n"


def git(repo: Path, *args: str) -> None:
    cp = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    r = tmp_path / "repo"
    (r / "deploy").mkdir(parents=True)
    (r / ".oomdoctor.yaml").write_text(PROJECT)
    (r / "deploy" / "vllm.yaml").write_text(CONFIG.format(kv=7500000000))      # the D incident's failing config
    (r / "deploy" / "vllm.env").write_text("VLLM_USE_FLASHINFER_SAMPLER=0\n")
    (r / "deploy" / "other.yaml").write_text("max-model-len: 8192\n")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    git(r, "init", "-q", "-b", "main")
    git(r, "-c", "user.name=t", "-c", "user.email=t@e", "add", ".")
    git(r, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "base")
    monkeypatch.chdir(r)
    (r / "deploy" / "vllm.yaml").write_text(CONFIG.format(kv=3355443200))      # the change: the lever that passed
    return r


def gate(capsys) -> tuple[int, dict]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["gate", "--json"])
    out = capsys.readouterr().out
    return e.value.code, json.loads(out)


def the(data: dict, path: str = "deploy/vllm.yaml") -> dict:
    [c] = [c for c in data["configs"] if c["path"] == path]
    return c


def copy_card(repo: Path) -> Path:
    (repo / "incidents").mkdir(exist_ok=True)
    shutil.copy(INC / "h200-D_fail.yaml", repo / "incidents")
    shutil.copytree(INC / "h200-D_fail.runs", repo / "incidents" / "h200-D_fail.runs")
    return repo / "incidents" / "h200-D_fail.yaml"


def test_the_real_retest_proves_the_config(repo, capsys):
    rc, data = gate(capsys)
    assert rc == 1 and the(data)["reason_code"] == "no_receipt"
    copy_card(repo)
    rc, data = gate(capsys)
    assert rc == 0, data
    assert the(data)["reason_code"] == "receipt" and "incidents/h200-D_fail.yaml attempt 2" in the(data)["reason"]


def test_a_forged_ten_line_receipt_fails(repo, capsys):
    rc, data = gate(capsys)
    fp = the(data)["fingerprint"]                                     # what the failing gate printed
    (repo / "incidents").mkdir()
    (repo / "incidents" / "ok.yaml").write_text(
        "schema: oomdoctor.incident/v1\nattempts:\n- n: 1\n  at: '2026-12-01T00:00:00Z'\n  lever: none\n  change: {}\n"
        f"  outcome: pass\n  engine: {{name: vllm, version: 0.25.1, mode: real}}\n  config_fingerprint: {fp}\n"
        "  target_device: nvidia-h200\n")
    assert len((repo / "incidents" / "ok.yaml").read_text().splitlines()) == 10
    rc, data = gate(capsys)
    assert rc == 1 and the(data)["reason_code"] == "unverified"
    assert "says it passed, but it records no effective config" in the(data)["reason"]


def _claim(repo: Path, log: Path, sha: str | None = None) -> None:
    """An attempt that claims a pass of this exact config, consistent in every field, with ``log`` as its log."""
    ec = load_serving_config("deploy/vllm.yaml").effective_config
    runs = repo / "receipts" / "c.runs"
    runs.mkdir(parents=True)
    shutil.copy(log, runs / "attempt-1.log")
    d = {"schema": "oomdoctor.receipt/v1", "oomdoctor_version": "0.1.0", "config_fingerprint": rcpt._fingerprint(ec),
         "effective_config": ec, "attempts": [{
             "n": 1, "at": "2026-12-01T00:00:00Z", "lever": "none", "change": {}, "outcome": "pass",
             "engine": {"name": "vllm", "version": "0.25.1", "mode": "real"}, "target_device": "nvidia-h200",
             "config_fingerprint": rcpt._fingerprint(ec), "effective_config": ec, "log_path": "c.runs/attempt-1.log",
             "log_sha256": sha or file_sha256(runs / "attempt-1.log")}]}
    (repo / "receipts" / "c.yaml").write_text(yaml.safe_dump(d))


@pytest.mark.parametrize("log,sha,why", [
    (D_FAIL, None, "its log does not show a clean run (kv_allocation_oom"),
    (A_PASS, None, "the config in its log is not this one (log → receipt: settings.gpu_memory_utilization"),
    (D_PASS, "0" * 64, "does not have the recorded sha256"),
])
def test_a_receipt_its_log_does_not_back_fails(repo, capsys, log, sha, why):
    _claim(repo, log, sha)
    rc, data = gate(capsys)
    assert rc == 1 and the(data)["reason_code"] == "unverified" and why in the(data)["reason"], the(data)["reason"]


def test_a_log_edited_after_the_run_fails(repo, capsys):
    card = copy_card(repo)
    log = card.parent / "h200-D_fail.runs" / "attempt-2-kv_cache_memory_bytes.log"
    log.write_text(log.read_text().replace("'kv_cache_memory_bytes': 3355443200", "'kv_cache_memory_bytes': 3355443201"))
    rc, data = gate(capsys)
    assert rc == 1 and "does not have the recorded sha256" in the(data)["reason"]


def test_write_receipt_needs_a_run_that_passed(repo, capsys):
    sc = load_serving_config("deploy/vllm.yaml")
    att = {"outcome": "pass", "engine": {"name": "vllm", "version": "0.25.1", "mode": "real"}, "target_device": "nvidia-h200"}
    (repo / "receipts").mkdir()
    with pytest.raises(BadInput, match="does not show a pass of this config: its log does not show a clean run"):
        rcpt.write_receipt(repo / "receipts", sc.effective_config, att, log=D_FAIL)
    assert not list((repo / "receipts").iterdir())
    p = rcpt.write_receipt(repo / "receipts", sc.effective_config, att, log=D_PASS)
    a = rcpt.read_receipt(p)["attempts"][0]
    assert (p.parent / a["log_path"]).read_bytes() == D_PASS.read_bytes() and a["log_sha256"] == file_sha256(D_PASS)
    rc, data = gate(capsys)
    assert rc == 0 and the(data)["receipt"]["path"] == f"receipts/{p.name}"


def test_a_config_taken_out_of_the_project_file_fails(repo, capsys):
    git(repo, "checkout", "-q", "--", "deploy/vllm.yaml")
    (repo / ".oomdoctor.yaml").write_text(PROJECT.replace("  - {path: deploy/vllm.yaml, kind: vllm-config, "
                                                          "env_file: deploy/vllm.env}\n", ""))
    rc, data = gate(capsys)
    assert rc == 1
    c = the(data)
    assert (c["status"], c["change"], c["reason_code"]) == ("fail", "undeclared", "undeclared")
    assert "no longer declares it" in c["reason"]
    (repo / "deploy" / "vllm.yaml").unlink()                          # gone with its entry: nothing to verify
    rc, data = gate(capsys)
    assert rc == 0 and [(c["path"], c["change"], c["status"]) for c in data["configs"]] == [
        ("deploy/vllm.yaml", "deleted", "pass")]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed")
def test_signed_receipts(repo, capsys, tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("ci", "mallory"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(keys / name)], check=True)
    signers = f"ci@example.com {(keys / 'ci.pub').read_text().split(' ', 2)[0]} {(keys / 'ci.pub').read_text().split()[1]}\n"
    git(repo, "stash", "-q")                                          # commit signing at the base, keep the change
    (repo / ".oomdoctor").mkdir()
    (repo / ".oomdoctor" / "allowed_signers").write_text(signers)
    (repo / ".oomdoctor.yaml").write_text(PROJECT + "signers: .oomdoctor/allowed_signers\n")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "signers")
    git(repo, "stash", "pop", "-q")
    card = copy_card(repo)
    rc, data = gate(capsys)
    assert rc == 1 and the(data)["reason_code"] == "unsigned" and "h200-D_fail.yaml.sig is missing" in the(data)["reason"]
    sign(card, keys / "mallory")
    rc, data = gate(capsys)
    assert rc == 1 and "is by no signer of .oomdoctor/allowed_signers" in the(data)["reason"]
    sign(card, keys / "ci")
    rc, data = gate(capsys)
    assert rc == 0, data
    card.write_text(card.read_text().replace("summary:", "summary: edited;", 1))
    rc, data = gate(capsys)
    assert rc == 1 and "does not verify" in the(data)["reason"]
    # a change cannot bring its own key: the signers file is read from the base
    (repo / ".oomdoctor" / "allowed_signers").write_text(signers + signers.replace(
        (keys / "ci.pub").read_text().split()[1], (keys / "mallory.pub").read_text().split()[1]))
    sign(card, keys / "mallory")
    rc, data = gate(capsys)
    assert rc == 1 and "by no signer" in the(data)["reason"]
