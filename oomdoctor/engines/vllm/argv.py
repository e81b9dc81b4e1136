"""THE vLLM command-line reader: ``vllm serve MODEL --flag value ...`` → options, one parser for every stage; and
its writer (:func:`serve_argv`: options → the flags a retest launches and the screen gives back to paste).

The gate (serve scripts), ``oomdoctor record -- vllm serve ...`` (the workload) and the plugin (which fields a
command line set) all read vLLM's arguments here, so that ``-tp 2``, ``--no-x``, ``--flag=value``, bare
boolean flags and the nargs='+' settings mean the same everywhere.
"""
from __future__ import annotations

import json
import posixpath
import re
from typing import Any, Iterable

from oomdoctor.card import fingerprint as fpmod
from oomdoctor.errors import BadInput
from oomdoctor.units import parse_size

# vLLM flags that take no value (argparse store_true / BooleanOptionalAction). Needed to tell
# ``--enforce-eager MODEL`` (flag, then the positional model) from ``--max-model-len 32768``.
BOOL_FLAGS = frozenset({
    "enforce_eager", "enable_prefix_caching", "enable_chunked_prefill", "skip_mm_profiling",
    "enable_flashinfer_autotune", "trust_remote_code", "disable_log_stats", "disable_log_requests",
    "enable_log_requests", "enable_log_outputs", "enable_auto_tool_choice", "disable_custom_all_reduce",
    "enable_lora", "enable_lora_bias", "fully_sharded_loras", "disable_frontend_multiprocessing",
    "enable_sleep_mode", "headless", "disable_uvicorn_access_log", "enable_request_id_headers",
    "disable_fastapi_docs", "enable_server_load_tracking", "enable_force_include_usage",
    "enable_prompt_tokens_details", "return_tokens_as_token_ids", "enable_expert_parallel", "enable_eplb",
    "async_scheduling", "disable_sliding_window", "disable_cascade_attn", "skip_tokenizer_init",
    "enable_prompt_embeds", "allow_credentials", "enable_tokenizer_info_endpoint", "use_tqdm_on_load",
    "disable_mm_preprocessor_cache", "disable_async_output_proc", "enable_dbo", "data_parallel_hybrid_lb",
    "data_parallel_external_lb", "enable_multimodal_encoder_data_parallel", "enable_log_deltas",
    "disable_chunked_mm_input", "enable_mfu_metrics", "kv_sharing_fast_prefill", "calculate_kv_scales",
})
LIST_SETTINGS = frozenset({"cuda_graph_sizes"})              # canonical names; nargs='+' on the command line
#: vLLM's single-dash aliases (without the dash) → the EngineArgs field.
SHORT_FLAGS = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size",
               "q": "quantization", "O": "compilation_config", "cc": "compilation_config"}
SERVE_MODULES = ("vllm.entrypoints.openai.api_server",)
SERVE_CLI_MODULES = ("vllm.entrypoints.cli.main",)

Pair = tuple[str, Any]


def serve_argv(args: dict[str, Any]) -> list[str]:
    """``vllm serve`` flags for engine arguments, in their order: a bool as ``--x-y`` / ``--no-x-y``, a list as the
    words of an nargs='+' flag, a dict as JSON; None is left out."""
    argv: list[str] = []
    for k, v in args.items():
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            argv.append(flag if v else "--no-" + k.replace("_", "-"))
        elif isinstance(v, (list, tuple)):
            argv += [flag] + [json.dumps(x) if isinstance(x, (dict, list)) else str(x) for x in v]
        elif isinstance(v, dict):
            argv += [flag, json.dumps(v)]
        elif v is not None:
            argv += [flag, str(v)]
    return argv


def size_arg(v: Any, where: str) -> int:
    """A size in bytes as a config writes it (``25769803776``, ``"24GiB"``); BadInput naming ``where``."""
    if isinstance(v, bool):
        raise BadInput(f"{where}: must be a size in bytes (e.g. 25769803776 or \"24GiB\"), found {v!r}")
    try:
        n = parse_size(str(v))
    except BadInput as e:
        raise BadInput(f"{where}: {e}")
    if n < 0:
        raise BadInput(f"{where}: must not be negative")
    return n


def is_number(t: str) -> bool:
    try:
        float(t)
        return True
    except ValueError:
        return False


def is_flag(t: str) -> bool:
    return t.startswith("-") and t != "-" and not is_number(t)


def find_serve(toks: list[str]) -> int | None:
    """Index of the first engine argument after ``vllm serve`` / ``python -m vllm.entrypoints...``."""
    for i, t in enumerate(toks):
        b = posixpath.basename(t)
        if b == "vllm" and i + 1 < len(toks) and toks[i + 1] == "serve":
            return i + 2
        if re.fullmatch(r"python[0-9.]*", b) and i + 2 < len(toks) and toks[i + 1] == "-m":
            if toks[i + 2] in SERVE_MODULES:
                return i + 3
            if toks[i + 2] in SERVE_CLI_MODULES and i + 3 < len(toks) and toks[i + 3] == "serve":
                return i + 4
    return None


def flag_key(t: str) -> tuple[str, str | None]:
    """``--max-model-len=8k`` → ("max_model_len", "8k"); ``-tp`` → ("tensor_parallel_size", None)."""
    long = t.startswith("--")
    name, eq, val = t[2 if long else 1:].partition("=")
    key = name.replace("-", "_")
    if not long:
        key = SHORT_FLAGS.get(key, key)
    return key, (val if eq else None)


def _is_bool(key: str) -> bool:
    return key in BOOL_FLAGS or (key.startswith("no_") and (key[3:] in BOOL_FLAGS or fpmod.canonical_key(key[3:]) is not None))


def _flag_value(key: str, toks: list[str], i: int) -> tuple[Any, int]:
    """The value of the flag at ``toks[i]`` (given without ``=``) and the index after it."""
    if _is_bool(key):
        return True, i + 1
    if fpmod.canonical_key(key) in LIST_SETTINGS:
        vals: list[str] = []
        i += 1
        while i < len(toks) and not is_flag(toks[i]):
            vals += [x for x in toks[i].split(",") if x]
            i += 1
        return vals, i
    if i + 1 < len(toks) and not is_flag(toks[i + 1]):
        return toks[i + 1], i + 2
    return True, i + 1


def split_options(toks: list[str]) -> tuple[list[Pair], list[str]]:
    """Engine arguments → ([(snake_case option, value as written)], [positional words])."""
    pairs: list[Pair] = []
    positional: list[str] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t == "--":
            positional += toks[i + 1:]
            break
        if not is_flag(t):
            positional.append(t)
            i += 1
            continue
        key, val = flag_key(t)
        if val is not None:
            pairs.append((key, val))
            i += 1
        else:
            value, i = _flag_value(key, toks, i)
            pairs.append((key, value))
    return pairs, positional


def parse_serve_args(toks: list[str], where: str) -> tuple[str | None, str | None, list[Pair], list[str]]:
    """The tokens after ``vllm serve`` → (model, revision, [(option, value)], [--config files])."""
    model = revision = None
    pairs: list[Pair] = []
    configs: list[str] = []
    found, positional = split_options(toks)
    for key, value in found:
        if key in ("model", "model_tag"):
            model = str(value)
        elif key == "revision":
            revision = str(value)
        elif key == "config":
            configs.append(str(value))
        else:
            pairs.append((key, value))
    if positional:
        if model is not None or len(positional) > 1:
            extra = positional[1:] if model is None else positional
            raise BadInput(f"{where}: unexpected argument {extra[0]!r} (one model only; if it is the value of a flag "
                           f"the gate does not know, write --flag=value)")
        model = positional[0]
    return model, revision, pairs, configs


def json_like(v: Any) -> Any:
    if isinstance(v, str) and v.strip()[:1] in ("{", "["):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def _normalize_pair(raw: str, v: Any, origin: str) -> tuple[str, Any] | None:
    k = str(raw).strip().lstrip("-").replace("-", "_")
    if not k:
        return None
    if k.startswith("no_") and fpmod.canonical_key(k[3:]) is not None and (isinstance(v, bool) or v in (None, "")):
        k, v = k[3:], (not v) if isinstance(v, bool) else False
    v = json_like(v)
    ck = fpmod.canonical_key(k)
    if ck == "kv_cache_memory_bytes" and isinstance(v, str) and not fpmod.HUMAN_INT_RE.match(v.strip()) \
            and not is_number(v.strip()):
        v = size_arg(v, f"{origin}: {raw}")                     # '4.84GiB' (vLLM itself takes '5G' or bytes)
    if ck in LIST_SETTINGS and v is not None and not isinstance(v, (list, tuple, bool)):
        v = [v]
    return k, v


def normalize_args(pairs: Iterable[Pair], origin: str, strict: bool) -> dict[str, Any]:
    """Engine options as written (kebab or snake, ``--no-x``) → one snake_case dict.

    ``no_x: true`` becomes ``x: false`` for memory settings, JSON strings become objects, the nargs='+'
    settings become lists. ``strict`` (a YAML/JSON mapping): two spellings of one setting with different
    values are an error; otherwise (a command line) the later one wins, as with argparse."""
    out: dict[str, Any] = {}
    seen: dict[str, Pair] = {}
    for raw, v0 in pairs:
        norm = _normalize_pair(raw, v0, origin)
        if norm is None:
            continue
        k, v = norm
        slot = fpmod.canonical_key(k) or k
        if slot in seen:
            prev_k, prev_v = seen[slot]
            if strict and fpmod.normalize_value(prev_v) != fpmod.normalize_value(v):
                raise BadInput(f"{origin}: {prev_k!r} and {raw!r} both set {slot}, to different values "
                               f"({prev_v!r} and {v!r})")
            out.pop(prev_k, None)
        out[k] = v
        seen[slot] = (k, v)
    return out


def flagged_fields(argv: list[str], names: list[str]) -> list[str]:
    """EngineArgs fields named by flags on a command line (``--max-model-len 8k``, ``--no-enforce-eager``,
    ``-tp 2``, unique prefixes as argparse allows)."""
    known = set(names)
    out: list[str] = []
    for a in argv:
        if a.startswith("-") and not a.startswith("--") and a[1:] in SHORT_FLAGS:
            out.append(SHORT_FLAGS[a[1:]])
            continue
        if not a.startswith("--") or a == "--":
            continue
        key = a[2:].split("=", 1)[0].replace("-", "_")
        for k in (key, key[3:] if key.startswith("no_") else None, key[8:] if key.startswith("disable_") else None):
            if k and k in known:
                out.append(k)
                break
        else:
            pref = [n for n in known if n.startswith(key)] if key else []
            if len(pref) == 1:
                out.append(pref[0])
    return [n for n in dict.fromkeys(out) if n in known]
