"""A lever's change as the user pastes it into their launcher: ``vllm serve MODEL ... --max-model-len 1998848``,
``LLM(..., max_model_len=1998848)``, ``export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.

The flags are :mod:`oomdoctor.levers.flags`'s (the engine's ``levers.yaml`` ``settings``); the command around them is
the same file's ``commands`` table (``serve: "vllm serve {model} ... {flags}"``, ``offline: "LLM(..., {args})"``).
An engine without a ``commands`` table gets its flags alone.

When the card knows the user's own arguments (vLLM's ``non-default args`` line, or a command line the paste quotes),
:func:`whole_command` gives their whole command back with the ONE change last (the table's ``whole`` templates):
``vllm serve /m --max-model-len 32768 --port 8012 --enforce-eager``. A secret argument is never written: the line
after the command names it for the user to add back.
"""
from __future__ import annotations

import re
import shlex
from functools import lru_cache
from typing import Any

from oomdoctor.engines.vllm.argv import serve_argv
from oomdoctor.levers.flags import OFFLINE_LAUNCHERS, flag_for, lever_table
from oomdoctor.redact import MASK

_ENV_RE = re.compile(r"^[A-Z_][A-Z0-9_]*=")
# a value vLLM's non-default args printed as an object's repr ("CompilationConfig(level=3, ...)", "<Enum.X: 1>"):
# no command line writes it back
_REPR_RE = re.compile(r"[A-Za-z_][\w.]{0,128}\(|<")


@lru_cache(maxsize=16)
def commands(engine: str) -> dict[str, str]:
    """The ``commands`` table of ``engines/<engine>/levers.yaml`` ({} when there is none)."""
    table = lever_table(engine).get("commands")
    return {str(k): str(v) for k, v in table.items()} if isinstance(table, dict) else {}


def _value(k: str, v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    return str(v)


def paste_text(engine: str, launcher: str | None, model: str | None, lever: dict[str, Any]) -> list[str]:
    """The lines to paste for ``lever`` (its recorded ``flag`` when the lever engine wrote one); for a change that is
    not a setting of the engine (``free_other_processes``, ``larger_gpu``) the change itself, ``key = value``."""
    change = lever.get("change") or {}
    if lever.get("id") == "free_other_processes":
        return process_text(change.get("stop_pids") or [])
    if not change:                                  # larger_gpu: nothing to paste
        return []
    words = [flag_for(engine, k, v, launcher) for k, v in change.items()]
    if any(w is None for w in words):
        if lever.get("flag"):                       # the lever engine wrote it in the engine's words already
            return [str(lever["flag"])]
        return [", ".join(f"{k} = {_value(k, v)}" for k, v in change.items())]
    flags = [str(w) for w in words]
    env = [f for f in flags if _ENV_RE.match(f)]
    args = [f for f in flags if f not in env]
    out = [f"export {e}" for e in env]
    if args:
        style = "offline" if (launcher or "") in OFFLINE_LAUNCHERS else "serve"
        template = commands(engine).get(style)
        joined = ", ".join(args) if style == "offline" else " ".join(args)
        out.append(template.format(model=model or "MODEL", flags=joined) if template else joined)
    return out


#: what an operator runs to see which processes hold a GPU's memory (nvidia-smi's compute-apps query)
HOLDERS_QUERY = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"


def process_text(pids: list[Any]) -> list[str]:
    """Freeing the GPU: the query that shows what holds its memory, and the processes the log names, to stop (a
    process is stopped by its owner: nothing here is run by oomdoctor)."""
    named = [str(int(p)) for p in pids if isinstance(p, int) or (isinstance(p, str) and p.isdigit())]
    return [HOLDERS_QUERY] + ([f"kill {' '.join(named)}     # what the log names as holding the memory"] if named else [])


def _known_command(engine: str, wl: dict[str, Any], lever: dict[str, Any]) -> tuple[str, str] | None:
    """(style, template) when the card knows the user's command and the lever is a setting; else None."""
    style = "offline" if (wl.get("launcher") or "") in OFFLINE_LAUNCHERS else "serve"
    template = (lever_table(engine).get("whole") or {}).get(style)
    if not template or "launch_args" not in wl or wl.get("launcher_assumed") or not wl.get("model"):
        return None
    if not lever.get("change") or lever.get("id") == "free_other_processes":
        return None
    return style, str(template)


def _writable(v: Any) -> bool:
    return not (isinstance(v, str) and _REPR_RE.match(v))


def whole_command(engine: str, wl: dict[str, Any], lever: dict[str, Any]) -> list[str] | None:
    """The user's whole command with this lever's ONE change as its last argument (``export`` lines first for an
    environment variable), or None: the card does not know the command (no explicit arguments read, the launcher
    assumed), the lever is not a setting, or an argument cannot be written back."""
    known = _known_command(engine, wl, lever)
    if known is None:
        return None
    style, template = known
    change = lever["change"]
    words = [flag_for(engine, k, v, wl.get("launcher")) for k, v in change.items()]
    own = {**({} if style == "offline" else wl.get("launch_args") or {}), **(wl.get("engine_args") or {})}
    kept = {k: v for k, v in own.items() if k not in change and v is not None}
    if None in words or not all(_writable(v) for v in kept.values()):
        return None
    withheld = [k for k, v in kept.items() if MASK in str(v)]
    mine = {k: v for k, v in kept.items() if k not in withheld}
    env = [str(w) for w in words if _ENV_RE.match(str(w))]
    new = [str(w) for w in words if str(w) not in env]
    if style == "offline":
        line = template.format(args=", ".join([f"model={wl['model']!r}"] + [f"{k}={v!r}" for k, v in mine.items()] + new))
    else:
        args = [shlex.join(serve_argv({k: v})) for k, v in mine.items()] + new
        line = template.format(model=shlex.quote(str(wl["model"])), args=" ".join(args)).rstrip()
    # the flags last: the output's redaction would mask a word after them ("--hf-token (a" reads as a flag's value)
    note = ["# add back your own secret arguments, not written here: "
            + ", ".join("--" + k.replace("_", "-") for k in withheld)] if withheld else []
    return [f"export {e}" for e in env] + [line] + note
