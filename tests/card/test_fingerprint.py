"""The effective-config fingerprint: one value for one way of starting the engine, whatever the spelling.

Two configs that start the engine the same way must get the same fingerprint (kebab or snake case,
'8G' or 8589934592, a bare boolean flag or 'true', --no-x or x: false, a vLLM YAML or a serve script or
a serving profile); any difference in a memory-shaping setting, the model revision or the engine version
must give another one; settings that do not shape memory (port, host, ...) must not change it.
"""
from __future__ import annotations

import hashlib
import json

import pytest

from oomdoctor.card import fingerprint as fp
from oomdoctor.gate import normalize_args, parse_profiles, parse_serve_script, parse_vllm_yaml

MODEL, REV, VER = "Qwen/Qwen3-8B", "0123abcd", "0.25.1"


def f(args: dict, env: dict | None = None, **kw) -> str:
    return fp.fingerprint(fp.effective_config(kw.get("engine", "vllm"), kw.get("version", VER), kw.get("model", MODEL),
                                              kw.get("revision", REV), args, env, conditions=kw.get("conditions")))


# ----------------------------------------------------------------------------- normalisation
def test_kebab_snake_and_dashes_are_one_setting():
    base = f({"max_model_len": 32768, "gpu_memory_utilization": 0.9})
    assert f({"max-model-len": 32768, "gpu-memory-utilization": 0.9}) == base
    assert f({"--max-model-len": "32768", "--gpu-memory-utilization": "0.90"}) == base
    assert f({"gpu_memory_utilization": 0.9, "max_model_len": 32768}) == base          # order does not matter


def test_human_sizes_follow_vllm():
    assert f({"kv_cache_memory_bytes": "8G"}) == f({"kv_cache_memory_bytes": 8589934592})
    assert f({"kv_cache_memory_bytes": "8g"}) == f({"kv_cache_memory_bytes": 8_000_000_000})
    assert f({"max_model_len": "32k"}) == f({"max_model_len": 32000})
    assert f({"max_model_len": "32K"}) == f({"max_model_len": 32768})
    assert f({"kv_cache_memory_bytes": "8G"}) != f({"kv_cache_memory_bytes": "8g"})
    assert fp.normalize_value("1.5G") == 3 * (1 << 29)


def test_numbers_written_as_text_or_floats():
    assert f({"max_num_seqs": "64"}) == f({"max_num_seqs": 64}) == f({"max_num_seqs": 64.0})
    assert f({"gpu_memory_utilization": ".9"}) == f({"gpu_memory_utilization": 0.9})
    assert f({"gpu_memory_utilization": 1.0}) == f({"gpu_memory_utilization": 1})


def test_bool_flags_and_no_x():
    on = f({"enforce_eager": True})
    assert f({"enforce-eager": "true"}) == on
    assert f({"enforce_eager": "True"}) == on
    off = f({"enable_prefix_caching": False})
    assert f({"no_enable_prefix_caching": True}) == off
    assert f({"--no-enable-prefix-caching": None}) == off
    assert f({"enable-prefix-caching": "false"}) == off
    assert off != f({"enable_prefix_caching": True}) != f({})
    # through the config readers: a bare flag, a YAML boolean, --no-x, no_x: true
    a, _ = parse_vllm_yaml("enforce-eager: true\nno-enable-prefix-caching: true\n", "c.yaml")
    b, _ = parse_vllm_yaml("enforce_eager: yes\nenable_prefix_caching: false\n", "c.yaml")
    c = normalize_args([("--enforce-eager", True), ("--no-enable-prefix-caching", True)], "cli", strict=False)
    d = normalize_args([("no_enable_prefix_caching", False), ("enforce_eager", True)], "cli", strict=False)
    assert f(a) == f(b) == f(c) == f({"enforce_eager": True, "enable_prefix_caching": False})
    assert f(d) == f({"enforce_eager": True, "enable_prefix_caching": True})


def test_aliases_are_one_setting():
    assert f({"device_memory_utilization": 0.8}) == f({"gpu_memory_utilization": 0.8})
    assert f({"cudagraph_capture_sizes": [1, 2, 4]}) == f({"cuda_graph_sizes": [1, 2, 4]})
    assert f({"kv_cache_memory": "4G"}) == f({"kv_cache_memory_bytes": 4 << 30})


def test_same_config_in_every_format_has_one_fingerprint():
    yaml_args, ident = parse_vllm_yaml(
        "model: Qwen/Qwen3-8B\nport: 8000\nmax-model-len: 32k\nkv_cache_memory_bytes: 8G\nenforce-eager: true\n"
        "cuda-graph-sizes: [1, 2, 4]\nhf-overrides: '{\"rope_scaling\": null}'\n", "vllm.yaml")
    cmd = parse_serve_script(
        "#!/bin/sh\n"
        "exec vllm serve \"$MODEL\" --port 8000 \\\n  --max-model-len=32000 --kv-cache-memory-bytes 8589934592 \\\n"
        "  --enforce-eager --cuda-graph-sizes 1 2 4 --hf-overrides '{\"rope_scaling\": null}'\n",
        "serve.sh", {"MODEL": "Qwen/Qwen3-8B"})
    prof = parse_profiles(json.dumps({"profiles": {"p": {"window": 32000, "settings": {
        "kv_cache_memory_bytes": "8GiB", "enforce_eager": True,
        "cuda_graph_sizes": [1, 2, 4], "hf_overrides": {"rope_scaling": None}}}}}), "profiles.json")["p"]
    assert ident["model"] == cmd.model == MODEL
    assert f(yaml_args) == f(cmd.args) == f(prof.args)


def test_env_memory_vars_only():
    base = f({}, {})
    assert f({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) != base
    assert f({}, {"VLLM_ATTENTION_BACKEND": "FLASHINFER"}) != base
    assert f({}, {"CUDA_VISIBLE_DEVICES": "1"}) == base          # which GPU, not how much memory
    assert f({}, {"HF_TOKEN": "hf_x", "VLLM_LOGGING_LEVEL": "DEBUG", "HOME": "/root"}) == base


# ----------------------------------------------------------------------------- coverage
SECOND = {  # a second, different value for every canonical memory setting
    "max_model_len": (32768, 65536), "gpu_memory_utilization": (0.9, 0.85), "kv_cache_memory_bytes": ("8G", "9G"),
    "kv_cache_dtype": ("auto", "fp8"), "max_num_seqs": (64, 128), "max_num_batched_tokens": (8192, 16384),
    "enforce_eager": (True, False), "cuda_graph_sizes": ([1, 2, 4], [1, 2]), "max_cudagraph_capture_size": (256, 512),
    "quantization": ("fp8", "awq"), "dtype": ("bfloat16", "float16"), "tensor_parallel_size": (1, 2),
    "pipeline_parallel_size": (1, 2), "data_parallel_size": (1, 2), "cpu_offload_gb": (0, 4), "block_size": (16, 32),
    "enable_prefix_caching": (True, False), "enable_chunked_prefill": (True, False), "skip_mm_profiling": (True, False),
    "limit_mm_per_prompt": ({"image": 1}, {"image": 0}), "num_gpu_blocks_override": (1000, 2000),
    "kv_offloading_size": (0, 16), "enable_flashinfer_autotune": (True, False), "performance_mode": ("a", "b"),
    "hf_overrides": ({"x": 1}, {"x": 2}), "speculative_config": ({"n": 1}, {"n": 2}), "max_num_queued_reqs": (1, 2),
    "max_num_queued_tokens": (1, 2),
}


def test_every_memory_setting_changes_the_fingerprint():
    canon = set(fp.MEMORY_SETTINGS.values())
    assert canon == set(SECOND), f"new memory settings need a case here: {canon ^ set(SECOND)}"
    for key, (a, b) in SECOND.items():
        assert f({key: a}) != f({key: b}), key
        assert f({key: a}) != f({}), key                             # set vs left at the default
    for alias in fp.MEMORY_SETTINGS:
        a, b = SECOND[fp.MEMORY_SETTINGS[alias]]
        assert f({alias: a}) != f({alias: b}), alias


def test_identity_changes_the_fingerprint():
    base = f({"max_model_len": 32768})
    assert f({"max_model_len": 32768}, version="0.25.2") != base
    assert f({"max_model_len": 32768}, revision="ffff0000") != base
    assert f({"max_model_len": 32768}, revision=None) != base
    assert f({"max_model_len": 32768}, model="Qwen/Qwen3-14B") != base
    assert f({"max_model_len": 32768}, engine="sglang") != base


@pytest.mark.parametrize("unrelated", [
    {"port": 8001}, {"host": "0.0.0.0"}, {"--port": "9000", "--host": "127.0.0.1"}, {"served_model_name": "x"},
    {"api_key": "secret"}, {"disable_log_stats": True}, {"uvicorn_log_level": "debug"}, {"trust_remote_code": True},
])
def test_unrelated_settings_do_not_change_it(unrelated):
    base = {"max_model_len": 32768, "gpu_memory_utilization": 0.9}
    assert f({**base, **unrelated}) == f(base)


def test_conditions_are_additive():
    """Configs without conditions keep the fingerprint they had before conditions existed."""
    cfg = fp.effective_config("vllm", VER, MODEL, REV, {"max_model_len": 32768}, {})
    assert "conditions" not in cfg
    legacy = {"engine": "vllm", "engine_version": VER, "model": MODEL, "model_revision": REV,
              "settings": {"max_model_len": 32768}, "env": {}}
    blob = json.dumps(legacy, sort_keys=True, separators=(",", ":"))
    assert fp.fingerprint(cfg) == "sha256:" + hashlib.sha256(blob.encode()).hexdigest()
    assert fp.effective_config("vllm", VER, MODEL, REV, {"max_model_len": 32768}, {}, conditions={}) == cfg
    assert fp.effective_config("vllm", VER, MODEL, REV, {"max_model_len": 32768}, {},
                               conditions={"requires_free_bytes": None}) == cfg
    with_c = f({"max_model_len": 32768}, conditions={"requires_free_bytes": 40 << 30})
    assert with_c != f({"max_model_len": 32768})
    assert with_c != f({"max_model_len": 32768}, conditions={"requires_free_bytes": 20 << 30})
    assert with_c == f({"max_model_len": 32768}, conditions={"requires_free_bytes": "40G"})


def test_diff_names_what_differs():
    a = fp.effective_config("vllm", "0.25.1", MODEL, REV, {"max_model_len": 32768}, {},
                            conditions={"requires_free_bytes": 1})
    b = fp.effective_config("vllm", "0.26.0", MODEL, REV, {"max_model_len": 65536, "enforce_eager": True},
                            {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    d = fp.diff(a, b)
    assert "engine_version: '0.25.1' → '0.26.0'" in d
    assert "settings.max_model_len: 32768 → 65536" in d
    assert "settings.enforce_eager: '(default)' → True" in d
    assert "env.PYTORCH_CUDA_ALLOC_CONF: '(default)' → 'expandable_segments:True'" in d
    assert "conditions.requires_free_bytes: 1 → '(default)'" in d
    assert fp.diff(a, a) == []
