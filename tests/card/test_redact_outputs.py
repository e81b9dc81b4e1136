"""Twelve secrets planted in a real vLLM log (its harness header, env dump, non-default args and evidence lines)
reach no output: not the card, not stdout (report, ``--json``, ``--no-card``), not a ``.runs/`` log copy, not a
receipt. And no number is ever redacted: every number the committed incident cards hold survives redaction."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from conftest import FIXTURES, ROOT, invoke
from oomdoctor.redact import MASK, redact_argv, redact_env, redact_obj, redact_text

SECRETS = {
    "url_password": "Pw9xq7LmZt",
    "api_key_flag": "sEcReT-apikey-4242",
    "token_flag_eq": "tKn-8842-zzqq",
    "password_flag": "p4ssw0rd-Qv",
    "bearer": "eyBearerValue123456abc",
    "basic": "Ym9iOmh1bnRlcjJ4eXo=",
    "aws_secret": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "api_key_list_1": "listkey-alpha-111",
    "api_key_list_2": "listkey-beta-222",
    "hf_token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "aws_key_id": "AKIAZ7Q3EXAMPLE9KEYQ",
    "openai": "sk-proj-Zq8xW2vN5mK7pL3rT9yBqq",
}
S = SECRETS


def planted_log(tmp_path: Path) -> Path:
    lines = FIXTURES.joinpath("A_fail.log").read_text().splitlines()
    lines[0] = (f"# scenario A_fail; cmd: python serve.py --api-key {S['api_key_flag']} --token={S['token_flag_eq']} "
                f"--password {S['password_flag']} --max-num-batched-tokens 16384")
    lines[1] = ('# env: {"PYTHONPATH": "/root/site", "HF_TOKEN": "%s", "AWS_SECRET_ACCESS_KEY": "%s", '
                '"VLLM_LOGGING_LEVEL": "INFO"}' % (S["hf_token"], S["aws_secret"]))
    out = []
    for ln in lines:
        if "Chunked prefill is enabled" in ln:
            ln += (f" proxy=https://bob:{S['url_password']}@mirror.internal/m Authorization: Bearer {S['bearer']} "
                   f"Authorization: Basic {S['basic']} aws_secret_access_key = {S['aws_secret']} "
                   f"key id {S['aws_key_id']} openai {S['openai']}")
            out.append(ln)
            out.append("INFO 11-29 15:05:31 [utils.py:233] non-default args: {'model': '/root/model', 'api_key': "
                       f"['{S['api_key_list_1']}', '{S['api_key_list_2']}'], 'max_num_batched_tokens': 16384}}")
            continue
        out.append(ln)
    p = tmp_path / "planted.log"
    p.write_text("\n".join(out) + "\n")
    return p


def leaked(text: str) -> list[str]:
    return [k for k, v in SECRETS.items() if v in text]


def test_planted_log_still_diagnoses_and_holds_every_secret(tmp_path):
    p = planted_log(tmp_path)
    assert leaked(p.read_text()) == list(SECRETS)          # the planting worked: all twelve are in the input
    r = invoke("diagnose", p, "--no-card", "--no-device", "--json")
    assert r.rc == 0 and r.json()["classification"]["class"] == "kv_capacity"


@pytest.mark.parametrize("args", [("--json", "--no-card"), ("--no-card",), ("--json",), ()])
def test_no_secret_on_stdout_or_in_the_card(tmp_path, args):
    p = planted_log(tmp_path)
    card = tmp_path / "c.yaml"
    r = invoke("diagnose", p, "--no-device", "--out", card, *args)
    assert r.rc == 0, r.err
    assert leaked(r.out + r.err) == []
    if "--no-card" not in args:
        text = card.read_text()
        assert leaked(text) == []
        d = yaml.safe_load(text)
        assert d["workload"]["harness_cmd"][-2:] == ["--max-num-batched-tokens", "16384"]   # numbers kept
        assert MASK in text


@pytest.mark.slow
def test_no_secret_in_a_teed_runs_log(tmp_path):
    from oomdoctor.retest.procs import Group

    src = planted_log(tmp_path)
    log = tmp_path / "attempt-1.log"
    g = Group([sys.executable, "-c", f"import sys; sys.stdout.write(open({str(src)!r}).read())"], log)
    g.wait(timeout=60)
    g.stop()
    text = log.read_text()
    assert leaked(text) == [] and "Available KV cache memory: 124.52 GiB" in text


def test_no_secret_in_a_receipt(tmp_path):
    from oomdoctor.card import receipt as rcpt

    ec = {"engine": "vllm", "engine_version": "0.25.1", "model": "/root/model", "model_revision": None,
          "settings": {"max_model_len": 32768}, "env": {}}
    planted = planted_log(tmp_path).read_text().splitlines()
    att = {"outcome": "pass", "engine": {"name": "vllm", "version": "0.25.1", "mode": "real"},
           "target_device": "nvidia-h200", "argv": ["vllm", "serve", "m", "--api-key", S["api_key_flag"],
                                                    f"--token={S['token_flag_eq']}", "--password", S["password_flag"]]}
    from tests.gate.runlog import run_log

    log = run_log(tmp_path / "runs", ec)             # the run's own log (a real H200 pass, rewritten to this config)
    with log.open("a") as f:                         # ... with the planted log's lines that hold a secret (not its
        #                                            config lines: the log must still show a pass of this config)
        f.write("\n".join(ln for ln in planted if leaked(ln) and not ln.startswith("#")
                           and "non-default args" not in ln) + "\n")
    p = rcpt.write_receipt(tmp_path / "receipts" / "r.yaml", ec, att, log=log,
                           source={"path": "serve.yaml", "log": planted[:3]
                                   + [ln for ln in planted if "proxy=" in ln or "non-default" in ln]})
    text = p.read_text()
    assert leaked(text) == [] and "max_model_len: 32768" in text
    copies = [f for f in p.parent.rglob("*") if f.is_file() and f != p]
    assert copies, "the run's log travels with the receipt"
    for f in copies:
        assert leaked(f.read_text(errors="replace")) == [], f


def test_each_secret_form_alone():
    forms = [
        (f"git clone https://bob:{S['url_password']}@host/x", S["url_password"]),
        (f"--api-key {S['api_key_flag']}", S["api_key_flag"]), (f"--api-key={S['api_key_flag']}", S["api_key_flag"]),
        (f"--token {S['token_flag_eq']}", S["token_flag_eq"]), (f"--password={S['password_flag']}", S["password_flag"]),
        (f"['vllm', '--api-key', '{S['api_key_flag']}']", S["api_key_flag"]),
        (f"curl -H 'Authorization: Bearer {S['bearer']}'", S["bearer"]),
        (f"Authorization: Basic {S['basic']}", S["basic"]), (f"bearer {S['bearer']}", S["bearer"]),
        (f"aws_secret_access_key = {S['aws_secret']}", S["aws_secret"]),
        (f"export MY_SERVICE_SECRET_VALUE={S['password_flag']}", S["password_flag"]),
        (f'{{"OPENAI_API_KEY": "{S["api_key_flag"]}"}}', S["api_key_flag"]),
        (f"{{'api_key': ['{S['api_key_list_1']}', '{S['api_key_list_2']}']}}", S["api_key_list_2"]),
        (f"HF_TOKEN={S['hf_token']}", S["hf_token"]), (f"token {S['hf_token']}", S["hf_token"]),
        (f"id {S['aws_key_id']} x", S["aws_key_id"]), (f"key {S['openai']}", S["openai"]),
        ("gh token ghp_abcdefghijklmnopqrstuvwxyz0123", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
    ]
    for text, secret in forms:
        out = redact_text(text)
        assert secret not in out and MASK in out, (text, out)
    assert redact_env({"HF_TOKEN": "x123", "TOKENIZERS_PARALLELISM": "false"}) == {"HF_TOKEN": MASK,
                                                                                   "TOKENIZERS_PARALLELISM": "false"}
    assert redact_argv(["--api-key", "a", "b", "--hf-token=hf_x"]) == ["--api-key", MASK, "b", f"--hf-token={MASK}"]
    assert redact_obj({"api_key": ["k1x", "k2x"], "max_num_batched_tokens": 8192}) == {
        "api_key": [MASK, MASK], "max_num_batched_tokens": 8192}


NUMBER = re.compile(r"\d[\d,._]*(?:\s?[KMGT]i?B|\s?B\b|%|x\b)?")


@pytest.mark.parametrize("card", sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("incidents/**/*.yaml")))
def test_no_number_of_a_committed_card_is_redacted(card):
    """Every line of every committed card keeps every number it holds, through the text and the object path."""
    text = (ROOT / card).read_text()
    for line in text.splitlines():
        out = redact_text(line)
        assert NUMBER.findall(out) == NUMBER.findall(line), (line, out)
    d = yaml.safe_load(text)
    nums_in = NUMBER.findall(yaml.safe_dump(d))
    assert NUMBER.findall(yaml.safe_dump(redact_obj(d))) == nums_in


def test_engine_numbers_and_arithmetic_survive():
    for keep in ("KV per token = 244.14 GiB / 4,000,000 = 65,536 B",
                 "KV bytes per token = needed / max_model_len from the engine's error; available from the same line",
                 "GPU KV cache size: 2,040,672 tokens; max_num_batched_tokens=16384; kv_cache_memory_bytes=3000000000",
                 "--max-num-batched-tokens 8192 --max-model-len=32768 --kv-cache-memory-bytes 7.5e9",
                 "token_budget: 8192, key: 12, 'hf_token': None, password: 1234, Authorization: 42",
                 "KeyError: 'model.layers.0.self_attn'"):
        assert redact_text(keep) == keep
