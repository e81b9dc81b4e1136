"""What a retest may run without the user saying so.

A card is data: it may come from a stranger's log or be edited by hand. ``retest`` runs, unasked, only what it
builds itself — ``vllm serve MODEL --flag value`` or oomdoctor's own offline runner, from the model and the
engine arguments — and passes the engine only an environment it knows to be harmless. A ``command`` launcher (the
card's own argv), an engine argument that loads code (``trust_remote_code``, worker or plugin classes), a model
name that would be read as a flag, and any other environment variable (``LD_PRELOAD``, ``PYTHONPATH`` ...) need
``--trust-card``.
"""
from __future__ import annotations

import json
import shlex
from typing import Any

from oomdoctor.card.fingerprint import MEMORY_ENV
from oomdoctor.card.records import Workload
from oomdoctor.engines.vllm.argv import SHORT_FLAGS
from oomdoctor.errors import BadInput
from oomdoctor.redact import redact_argv

SAFE_ENV = frozenset(MEMORY_ENV) | frozenset({
    "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_LOGGING_LEVEL", "VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK",
    "PYTHONUNBUFFERED", "TOKENIZERS_PARALLELISM", "NCCL_NVLS_ENABLE", "NCCL_P2P_DISABLE", "NCCL_DEBUG",
    "CUDA_LAUNCH_BLOCKING", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD",
    "OOMDOCTOR_LADDER_FREE_BYTES"})
# engine arguments that make the engine import or run code named by the card: a class or module by name (vLLM's
# resolve_obj_by_qualname / import_module), a logging config (dictConfig's "()" factories), or a --config file
# (which may hold any argument, these included)
CODE_ARGS = frozenset({"trust_remote_code", "worker_cls", "worker_extension_cls", "tool_parser_plugin",
                       "reasoning_parser_plugin", "logits_processors", "middleware", "plugins",
                       "code_revision", "chat_template", "allowed_local_media_path", "config", "log_config_file",
                       "scheduler_cls", "kv_transfer_config", "ec_transfer_config", "io_processor_plugin",
                       "weight_transfer_config", "speculative_config"})
# engine arguments whose value may name a class to import; the values vLLM knows by name are harmless
NAMED_VALUES = {"distributed_executor_backend": frozenset({"mp", "ray", "uni", "external_launcher"})}
# a compilation config names code by a backend other than these, or by inductor passes (qualified names)
COMPILE_BACKENDS = frozenset({"", "inductor", "eager"})


def _code_arg(key: str, value: Any) -> bool:
    """Does engine argument ``key`` (or what argparse would expand it to: ``--trust-remote`` is a unique prefix of
    ``--trust-remote-code``) make the engine load code?"""
    k = key.lstrip("-").replace("-", "_")
    k = SHORT_FLAGS.get(k, k)
    if not k or value in (None, False, ""):
        return False
    if any(c.startswith(k) for c in CODE_ARGS):
        return True
    for name, known in NAMED_VALUES.items():
        if name.startswith(k) and str(value) not in known:
            return True
    if not "compilation_config".startswith(k):
        return False
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return False
    return isinstance(value, dict) and (str(value.get("backend") or "") not in COMPILE_BACKENDS
                                        or bool(value.get("inductor_passes")))


def untrusted(wl: Workload) -> list[str]:
    """Why this workload's launch was not derived by oomdoctor itself (empty: it was)."""
    out: list[str] = []
    launcher = wl.get("launcher")
    if launcher == "command":
        argv = [str(a) for a in wl.get("argv") or []]
        out.append(f"launcher 'command' runs the card's own command line: {shlex.join(redact_argv(argv))[:400]}")
    args: dict[str, Any] = dict(wl.get("engine_args") or {})
    code = sorted(str(k) for k, v in args.items() if _code_arg(str(k), v))
    if code:
        out.append(f"engine argument(s) {', '.join(code)} make the engine load code named by the card")
    bad_keys = sorted(str(k) for k in args if not str(k).replace("_", "").replace("-", "").isalnum())
    if bad_keys:
        out.append(f"engine argument name(s) that are not option names: {', '.join(repr(k)[:40] for k in bad_keys[:5])}")
    flags = sorted(str(k) for k, v in args.items() if isinstance(v, str) and v.startswith("-") and not _number(v))
    if flags:
        out.append(f"engine argument value(s) of {', '.join(flags[:5])} would be read as command-line flags")
    model = wl.get("model")
    if launcher != "command" and isinstance(model, str) and model.startswith("-"):
        out.append(f"model {model[:60]!r} would be read as a command-line flag")
    return out


def _number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def safe_env(env: dict[str, str], trusted: bool) -> tuple[dict[str, str], list[str]]:
    """(the card's environment the engine gets, the names held back). All of it when ``trusted``."""
    if trusted:
        return dict(env), []
    kept = {k: v for k, v in env.items() if k in SAFE_ENV or k.startswith("OOMDOCTOR_")}
    return kept, sorted(k for k in env if k not in kept)


def require_trusted(wl: Workload, trusted: bool) -> None:
    """BadInput (exit 2) when the launch needs ``--trust-card`` and the user did not pass it."""
    why = untrusted(wl)
    if why and not trusted:
        raise BadInput(f"refusing to run what the card says without --trust-card: {'; '.join(why)} "
                       f"(the card is data; check it, then pass --trust-card to run it)")
