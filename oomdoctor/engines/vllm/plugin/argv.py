"""The EngineArgs fields a ``vllm serve`` command line names (kept apart: a shared vLLM argv parser replaces it)."""
from __future__ import annotations

SHORT_FLAGS = {"-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size", "-dp": "data_parallel_size",
               "-q": "quantization", "-O": "compilation_config", "-cc": "compilation_config"}


def argv_fields(argv: list[str], names: list[str]) -> list[str]:
    """EngineArgs fields named by flags on a command line (``--max-model-len 8k``, ``--no-enforce-eager``,
    ``-tp 2``, unique prefixes as argparse allows)."""
    known = set(names)
    out: list[str] = []
    for a in argv:
        if a in SHORT_FLAGS:
            out.append(SHORT_FLAGS[a])
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
