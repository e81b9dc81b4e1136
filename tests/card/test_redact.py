"""Secrets never reach a card or a teed log: env by name, argv by flag, text by pattern."""
from __future__ import annotations

import pytest

from oomdoctor.redact import MASK, redact_argv, redact_env, redact_obj, redact_text


def test_env_by_name() -> None:
    out = redact_env({"HF_TOKEN": "hf_x", "OPENAI_API_KEY": "k", "VLLM_USE_V2_MODEL_RUNNER": "0", "PYTORCH_CUDA_ALLOC_CONF": "x"})
    assert out["HF_TOKEN"] == MASK and out["OPENAI_API_KEY"] == MASK
    assert out["VLLM_USE_V2_MODEL_RUNNER"] == "0" and out["PYTORCH_CUDA_ALLOC_CONF"] == "x"


def test_argv_by_flag_and_value() -> None:
    out = redact_argv(["vllm", "serve", "m", "--api-key", "s3cr3t-value", "--hf-token=hf_abcdefghijklmnopqrstuvwxyz",
                       "--kv-cache-memory-bytes", "3000000000", "--max-model-len", "32768"])
    assert out[4] == MASK and out[5] == f"--hf-token={MASK}"
    assert out[6:] == ["--kv-cache-memory-bytes", "3000000000", "--max-model-len", "32768"]


def test_text_patterns_keep_engine_numbers() -> None:
    t = redact_text("non-default args: {'api_key': 'sk-abcdef123456', 'max_num_batched_tokens': 16384}")
    assert "sk-abcdef123456" not in t and f"'api_key': '{MASK}'" in t and "16384" in t
    assert "hf_" not in redact_text("token hf_abcdefghijklmnopqrstuvwxyz in the log")
    keep = "GPU KV cache size: 2,040,672 tokens; max_num_batched_tokens=16384; kv_cache_memory_bytes=3000000000"
    assert redact_text(keep) == keep


def test_obj_deep() -> None:
    d = redact_obj({"workload": {"env": {"HF_TOKEN": "abc"}, "argv": ["x", "--api-key", "k123456"]},
                    "evidence": [{"text": "Bearer abcdefghijklmnopqrstuvwxyz"}], "numbers": {"kv_needed_bytes": 5}})
    assert d["workload"]["env"]["HF_TOKEN"] == MASK and d["workload"]["argv"][2] == MASK
    assert "abcdefghijklmnopqrstuvwxyz" not in d["evidence"][0]["text"] and d["numbers"]["kv_needed_bytes"] == 5


@pytest.mark.slow
def test_teed_engine_log_is_redacted(tmp_path) -> None:
    import sys

    from oomdoctor.retest.procs import Group

    log = tmp_path / "engine.log"
    g = Group([sys.executable, "-c", "print(\"non-default args: {'api_key': 'sk-abcdef123456', 'port': 8000}\")"], log)
    g.wait(timeout=30)
    g.stop()
    text = log.read_text()
    assert "sk-abcdef123456" not in text and MASK in text and "'port': 8000" in text


@pytest.mark.parametrize("line", [
    "ValueError: [key=hf_EVIDENCETOKENXXXXXXXXXXXXXXX password=evpass123 https://u:evpw@x.y/] To serve",
    "env: [HF_TOKEN=abc123secret]",
    'msg: "password=abc123secret"',
    "msg: 'api_key=abc123secret'",
    'a: [b: "c: password=abc123secret"]',
])
def test_a_secret_pair_inside_the_value_of_another_key_is_masked(line) -> None:
    """The value of a key that names no secret ("ValueError: [...]", "env: [...]") was consumed whole, and the
    ``password=`` or ``HF_TOKEN=`` inside it reached the card, the text and the JSON unmasked."""
    out = redact_text(line)
    assert "evpass123" not in out and "abc123secret" not in out and MASK in out, out


def test_pairs_stay_linear_and_keep_numbers() -> None:
    import time

    for s in ("a: [" * 300_000, "password=" * 100_000, "'k': " * 200_000):
        t0 = time.perf_counter()
        redact_text(s)
        assert time.perf_counter() - t0 < 2.0
    assert redact_text("cfg: [password=12345, max_num_seqs=256]") == "cfg: [password=12345, max_num_seqs=256]"
