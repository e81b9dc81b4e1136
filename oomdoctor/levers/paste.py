"""A lever's change as the user pastes it into their launcher: ``vllm serve MODEL ... --max-model-len 1998848``,
``LLM(..., max_model_len=1998848)``, ``export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.

The flags are :mod:`oomdoctor.levers.flags`'s (the engine's ``levers.yaml`` ``settings``); the command around them is
the same file's ``commands`` table (``serve: "vllm serve {model} ... {flags}"``, ``offline: "LLM(..., {args})"``).
An engine without a ``commands`` table gets its flags alone.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any


from oomdoctor.levers.flags import OFFLINE_LAUNCHERS, flag_for, lever_table

_ENV_RE = re.compile(r"^[A-Z_][A-Z0-9_]*=")


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
