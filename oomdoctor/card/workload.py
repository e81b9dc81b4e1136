"""The workload as far as the log reveals it: how the engine was launched, with which arguments
(explicit vs left at defaults), which environment, and what was requested.

Sources, in order of trust: an oomdoctor ``record`` header, a capture harness header (``# cmd:``,
``# env: {...}``, ``# nvml before start: {...}``, ``# ballast: {...}``), and the engine's own lines
(vLLM: ``non-default args: {...}`` = the explicit arguments; ``Initializing a V1 LLM engine ... with
config: ...`` = the resolved ones).
"""
from __future__ import annotations


import ast
import os
import json
import re
import shlex
from pathlib import Path
from typing import Any, cast

from oomdoctor.card.records import Requests, Workload
from oomdoctor.card.replay import replay_requests
from oomdoctor.diagnose.read import iter_lines
from oomdoctor.redact import redact_argv, redact_env, redact_obj

HEADER_LINES = 40
CONFIG_KV_RE = re.compile(r"(?:^|, )(?P<k>[a-z_]+)=(?P<v>[^,{}\[\]]+?)(?=, [a-z_]+=|$)")
# keys of vLLM's "non-default args" that are not engine settings
NOT_SETTINGS = {"model_tag", "disable_log_stats", "port", "host", "api_key", "served_model_name", "uvicorn_log_level",
                "disable_log_requests", "enable_log_requests"}
RESOLVED_KEYS = {"max_seq_len": "max_model_len", "tensor_parallel_size": "tensor_parallel_size",
                 "pipeline_parallel_size": "pipeline_parallel_size", "quantization": "quantization",
                 "enforce_eager": "enforce_eager", "kv_cache_dtype": "kv_cache_dtype", "dtype": "dtype",
                 "enable_prefix_caching": "enable_prefix_caching", "enable_chunked_prefill": "enable_chunked_prefill",
                 "data_parallel_size": "data_parallel_size"}
DEFAULT_REQUESTS: Requests = {"kind": "smoke", "prompt_tokens": 8, "max_tokens": 16, "concurrency": 1, "count": 1}


def _literal(s: str) -> Any:
    s = s.strip()
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(s)
    except ValueError:
        return None


def _scalar(v: str) -> Any:
    v = v.strip().strip("'\"")
    if v in ("None",):
        return None
    if v in ("True", "False"):
        return v == "True"
    if v.startswith("torch."):
        return v.split(".", 1)[1]
    try:
        return int(v)
    except ValueError:
        pass
    try:
        return float(v)
    except ValueError:
        return v


def parse_engine_args(text: str) -> dict[str, Any]:
    """vLLM's ``non-default args: {...}`` (a Python dict repr) → dict; values it cannot read stay strings."""
    val = _literal(text)
    if isinstance(val, dict):
        return {str(k): v for k, v in val.items()}
    out: dict[str, Any] = {}
    for m in re.finditer(r"'(?P<k>[a-z_]+)': (?P<v>'[^']*'|[^,}]+)", text):
        out[m.group("k")] = _scalar(m.group("v"))
    return out


def parse_engine_config(text: str) -> dict[str, Any]:
    """``model='/m', max_seq_len=4000000, ...`` → the memory-relevant resolved settings."""
    out: dict[str, Any] = {}
    for m in CONFIG_KV_RE.finditer(text):
        k = m.group("k")
        if k in RESOLVED_KEYS or k == "model":
            out[RESOLVED_KEYS.get(k, k)] = _scalar(m.group("v"))
    return out


def read_header(path: str | Path) -> dict[str, Any]:
    """The leading ``# ...`` lines a capture harness (or ``oomdoctor record``) wrote before the engine output."""
    out: dict[str, Any] = {}
    for n, raw in iter_lines(path):
        if n > HEADER_LINES:
            break
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("#"):
            continue
        body = line.lstrip("#").strip()
        if body.startswith("oomdoctor-record:"):
            val = _literal(body.split(":", 1)[1])
            if isinstance(val, dict):
                out["record"] = val
            continue
        for key in ("env", "nvml before start", "ballast"):
            if body.startswith(key + ":"):
                rest = body[len(key) + 1:].strip()
                val = _literal(rest)
                if val is None and key == "nvml before start":   # "free 150109880320 total 150754820096"
                    m = re.search(r"free (\d+) total (\d+)", rest)
                    val = {"free": int(m.group(1)), "total": int(m.group(2))} if m else None
                out[key.replace(" ", "_")] = val
        m = re.search(r"(?:^|; )cmd: (?P<cmd>.+)$", body)
        if m:
            out["cmd"] = m.group("cmd").strip()
    return out


def _ledger(matches: list) -> tuple[dict[str, Any], dict[str, Any], bool | None]:
    """(explicit arguments, resolved settings, served through the API server: True, through the offline API: False,
    not seen: None) from the matched ledger lines."""
    explicit: dict[str, Any] = {}
    resolved: dict[str, Any] = {}
    serve: bool | None = None
    for m in matches:
        g = m.groups
        if "engine_args" in g and not explicit:
            explicit = parse_engine_args(g["engine_args"])
        if "engine_config" in g and not resolved:
            resolved = parse_engine_config(g["engine_config"])
        if m.line.proc.startswith("APIServer"):
            serve = True
        elif "offline_launcher" in g and serve is None:
            serve = False
    for k, v in (("max_model_len", "max_model_len"), ("max_num_batched_tokens", "max_num_batched_tokens")):
        for m in matches:
            if k in m.numbers and m.rule.role == "info":
                resolved.setdefault(v, m.numbers[k])
    return explicit, resolved, True if "model_tag" in explicit else serve


def _pasted_command(matches: list) -> dict[str, Any] | None:
    """The first command line the paste quotes (``vllm.workload.command_line``) → its model and options, as data;
    None when there is none or it does not read as one (an unbalanced quote)."""
    from oomdoctor.engines.vllm.argv import find_serve, split_options

    m = next((m for m in matches if "command_line" in m.groups), None)
    if m is None or not _shlex_ok(m.groups["command_line"]):
        return None
    toks = shlex.split(m.groups["command_line"])[:256]
    start = find_serve(toks)
    if start is None:
        return None
    found, positional = split_options(toks[start:])
    model = next((str(v) for k, v in found if k in ("model", "model_tag")), None) or \
        (positional[0] if positional else None)
    args = _options([(k, v) for k, v in found if k not in ("model", "model_tag", "port", "config")])
    return {**args, **({"model": model} if model else {})}


def _launcher(engine: str | None, serve: bool | None) -> tuple[str, bool]:
    """(launcher, assumed): the API server's lines → ``vllm-serve``; the offline API's → ``vllm-llm``; neither in
    the paste → ``vllm-serve``, assumed (the path most pastes come from, and the user's flagless one)."""
    if engine != "vllm":
        return "unknown", False
    return ("vllm-llm", False) if serve is False else ("vllm-serve", serve is None)


def _from_header(wl: Workload, header: dict[str, Any]) -> None:
    """The capture harness's command and NVML reading before the start."""
    if header.get("cmd"):
        wl["harness_cmd"] = redact_argv(shlex.split(header["cmd"]))[:64] if _shlex_ok(header["cmd"]) else header["cmd"]
    nv = header.get("nvml_before_start")
    if isinstance(nv, dict) and "free" in nv:
        wl["free_at_start_bytes"] = int(nv["free"])
        if "total" in nv:
            wl["gpu_total_bytes"] = int(nv["total"])
        wl["free_at_start_source"] = "capture harness header (NVML before the start)"


def from_log(path: str | Path, matches: list, engine: str | None) -> Workload:
    """Build the card's workload section from the log's header and the matched ledger lines: the launcher, the model,
    the explicit arguments, the env (the harness's record and what the engine's own lines name), port, TP/PP."""
    header = read_header(path)
    explicit, resolved, serve = _ledger(matches)
    record = header.get("record") or {}
    if isinstance(record.get("workload"), dict):
        return _header_workload(record["workload"], resolved, engine, serve)
    pasted = _pasted_command(matches)
    if pasted is not None:
        serve = True
        if not explicit:               # the engine's own "non-default args" line wins over the quoted command
            explicit = pasted
    model = explicit.get("model") or explicit.get("model_tag") or resolved.get("model")
    settings = {k: v for k, v in explicit.items() if k not in NOT_SETTINGS and k != "model"}
    env: dict[str, Any] = header["env"] if isinstance(header.get("env"), dict) else {}
    revealed = revealed_env(matches)
    env = {**{r["name"]: r["value"] for r in revealed}, **env}       # the harness's own record wins
    server = _server_port(matches)
    launcher, assumed = _launcher(engine, True if server is not None else serve)
    wl: Workload = {
        "launcher": launcher,
        "model": model,
        "engine_args": settings,
        "explicit_args": sorted(settings),
        "resolved": resolved,
        "env": redact_env({str(k): str(v) for k, v in env.items()}),
        "requests": Requests(**DEFAULT_REQUESTS),
        "baseline": None,
        "source": "log",
    }
    if assumed:
        wl["launcher_assumed"] = True
    if explicit:        # the user's own arguments are known: the screen can give back their whole command
        wl["launch_args"] = redact_obj({k: v for k, v in explicit.items() if k in NOT_SETTINGS and k != "model_tag"})
    if revealed:
        wl["env_revealed"] = revealed
    replay = replay_requests(matches, settings.get("max_model_len") or resolved.get("max_model_len"))
    if replay:
        wl["requests"], wl["requests_source"] = replay
    _parallel(wl, resolved, settings)
    ranks = _ranks_seen(matches)
    if ranks > 1 and "parallel" not in wl:     # a lower bound of the GPUs (TP x PP), their sizes unknown
        wl["parallel"] = {"ranks_seen": ranks}
    port = explicit.get("port") or server
    if port:
        wl["port"] = int(port)
    _from_header(wl, header)
    return wl


#: 0.25.x picks the V2 model runner by itself for these plain decoder architectures (vllm/config/vllm.py
#: ``_is_default_v2_model_runner_model``); 0.33 for every model unless it says why not
V2_DEFAULT_ARCHITECTURES_0_25 = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


def _version(v: str | None) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _first(matches: list, group: str) -> Any:
    return next((m for m in matches if group in m.groups), None)


def revealed_env(matches: list) -> list[dict[str, Any]]:
    """The environment variables the engine's own lines state (``... disabled via VLLM_X=0``), and the model-runner
    choice that only an environment variable explains: one entry per variable, with the line that shows it."""
    out: dict[str, dict[str, Any]] = {}
    for m in matches:
        if "env_var" in m.groups and "env_value" in m.groups and m.groups["env_var"] not in out:
            out[m.groups["env_var"]] = {"name": m.groups["env_var"], "value": m.groups["env_value"], "line": m.n,
                                        "rule": m.rule.id}
    v1, v2, fallback = (_first(matches, g) for g in ("model_runner_v1", "model_runner", "v2_unsupported"))
    cfg, arch = _first(matches, "engine_version"), _first(matches, "architecture")
    version = _version(cfg.groups["engine_version"] if cfg else None)
    if v1 is not None and v2 is None and fallback is None and "VLLM_USE_V2_MODEL_RUNNER" not in out:
        default_v2 = version >= (0, 33) or ((0, 25) <= version < (0, 33) and arch is not None
                                            and arch.groups["architecture"] in V2_DEFAULT_ARCHITECTURES_0_25)
        if default_v2:
            out["VLLM_USE_V2_MODEL_RUNNER"] = {
                "name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0", "line": v1.n, "rule": v1.rule.id,
                "inferred": "the V1 model runner loaded the model, without the engine's fallback warning, where this "
                            "version picks V2 by itself: only VLLM_USE_V2_MODEL_RUNNER=0 does that"}
    return list(out.values())


def _server_port(matches: list) -> int | None:
    m = _first(matches, "server_url")
    if m is None:
        return None
    port = re.search(r":(\d{1,5})(?:/|$)", m.groups["server_url"])
    return int(port.group(1)) if port else None


_RANK_RE = re.compile(r"(?:\brank[= ]|_TP|\bTP)(\d{1,4})\b")


def _ranks_seen(matches: list) -> int:
    """How many worker ranks the process prefixes name ((VllmWorker rank=5 pid=..), (Worker_TP3 pid=..)): rank 5
    means at least 6 GPUs, whatever the paste's other ranks."""
    ranks = (_RANK_RE.search(m.line.process or "") for m in matches)
    return max((int(r.group(1)) + 1 for r in ranks if r), default=0)


def _parallel(wl: Workload, resolved: dict[str, Any], settings: dict[str, Any]) -> None:
    """TP / PP / DP sizes the engine resolved; more than one GPU is a setting the re-run must repeat."""
    sizes = {k: int(resolved[k]) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
             if isinstance(resolved.get(k), int)}
    if not sizes:
        return
    gpus = 1
    for k, n in sizes.items():
        gpus *= max(1, n)
        if n > 1 and k not in settings:
            settings[k] = n
            wl["explicit_args"] = sorted(settings)
    wl["parallel"] = {**sizes, "gpus": gpus}


# what a log's header may say about its workload: data only (never a command to run: launcher "command",
# argv, base_args are dropped; the launcher is derived from the engine's own lines or is oomdoctor's own)
HEADER_LAUNCHERS = ("vllm-serve", "vllm-llm")
HEADER_DATA = ("model", "model_revision", "engine_args", "explicit_args", "resolved", "env", "requests", "baseline",
               "free_at_start_bytes", "free_at_start_source", "gpu_total_bytes", "emulate_free_bytes")


def _header_workload(raw: dict, resolved: dict[str, Any], engine: str | None, serve: bool | None) -> Workload:
    """An ``# oomdoctor-record:`` header's workload, as data: its fields of HEADER_DATA; the launcher only when
    it is one oomdoctor builds the command of itself (else derived from the engine's lines, as for any log)."""
    wl = cast(Workload, {k: raw[k] for k in HEADER_DATA if k in raw})
    launcher = raw.get("launcher")
    if launcher in HEADER_LAUNCHERS and isinstance(raw.get("argv"), list):
        wl["argv"] = redact_argv([str(a) for a in raw["argv"]])[:256]     # the engine's own argv, kept as data: a
        #                                                                   derived launcher never runs it
    dropped = sorted(k for k in raw if k not in HEADER_DATA and k not in ("launcher", "source") and k not in wl)
    if launcher not in HEADER_LAUNCHERS:
        if launcher is not None:
            dropped.append(f"launcher {str(launcher)[:40]!r}")
        launcher, assumed = _launcher(engine, serve)
        if assumed:
            wl["launcher_assumed"] = True
    wl["launcher"] = launcher
    if not isinstance(wl.get("engine_args"), dict):
        wl["engine_args"] = {}
    env = wl.get("env")
    wl["env"] = redact_env({str(k): str(v) for k, v in env.items()}) if isinstance(env, dict) else {}
    wl.setdefault("requests", Requests(**DEFAULT_REQUESTS))
    own = wl.get("resolved")
    wl["resolved"] = {**resolved, **(own if isinstance(own, dict) else {})}
    wl["source"] = "oomdoctor record header (data only)"
    if dropped:
        wl["header_dropped"] = [str(x)[:80] for x in dropped[:16]]
    return wl


def _shlex_ok(s: str) -> bool:
    try:
        shlex.split(s)
        return True
    except ValueError:
        return False


def workload_from_argv(argv: list[str], requests: dict) -> Workload:
    """`vllm serve MODEL --flag v ...` or `python -m vllm.entrypoints.cli.main serve ...` → a vllm-serve workload;
    anything else → a generic `command` workload (flags of levers are appended to its argv)."""
    env = recorded_env(os.environ)
    serve_at = None
    for i, a in enumerate(argv):
        if a == "serve" and i > 0 and (argv[i - 1].endswith("vllm") or argv[i - 1] == "vllm.entrypoints.cli.main"):
            serve_at = i
            break
    wl: dict = {"env": redact_env(env), "requests": {**DEFAULT_REQUESTS, **requests}, "baseline": None, "source": "oomdoctor record"}
    if serve_at is not None and serve_at + 1 < len(argv):
        model = argv[serve_at + 1]
        args = _serve_options(argv[serve_at + 2:])
        args.pop("port", None)
        wl.update(launcher="vllm-serve", model=model, engine_args=args, explicit_args=sorted(args))
    else:
        wl.update(launcher="command", model=None, argv=list(argv), engine_args={}, base_args={}, explicit_args=[])
    return cast(Workload, wl)


#: what `record` keeps of the environment it runs in: every variable an inference engine, torch, CUDA, NCCL,
#: Triton, FlashInfer or the Hugging Face libraries read, and the Python/loader paths the engine is found by
RECORDED_ENV_PREFIXES = ("VLLM_", "PYTORCH_", "TORCH_", "TORCHINDUCTOR_", "CUDA_", "CUBLAS_", "CUDNN_", "NCCL_", "NVIDIA_",
                         "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "TOKENIZERS_", "TRITON_", "FLASHINFER_", "OMP_",
                         "MKL_", "SGLANG_", "OLLAMA_", "LLAMA_", "TRTLLM_", "TLLM_", "LMDEPLOY_", "TGI_")
RECORDED_ENV_NAMES = ("PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONHASHSEED", "MAX_JOBS")
#: chosen by the retest itself (--gpu N), never replayed from a card
NOT_REPLAYED_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


def recorded_env(environ: Any) -> dict[str, str]:
    """The engine-relevant part of ``environ``, secrets masked (values of TOKEN/KEY/... names, token patterns)."""
    keep = {k: str(v) for k, v in environ.items()
            if (k.startswith(RECORDED_ENV_PREFIXES) or k in RECORDED_ENV_NAMES) and k not in NOT_REPLAYED_ENV}
    return redact_env(dict(sorted(keep.items())))


def _serve_options(rest: list[str]) -> dict:
    """The flags after the model, read by THE vLLM argv reader (engines/vllm/argv.py): ``-tp 2`` included."""
    from oomdoctor.engines.vllm.argv import split_options

    return _options(split_options(rest)[0])


def _options(found: list) -> dict:
    args: dict = {}
    for key, val in found:
        if key.startswith("no_") and val is True:
            args[key[3:]] = False
        else:
            args[key] = _coerce(val)
    return args


def _coerce(v: str):
    from oomdoctor.card.fingerprint import normalize_value
    return normalize_value(v)
