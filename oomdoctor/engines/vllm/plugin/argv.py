"""The EngineArgs fields a ``vllm serve`` command line names: THE vLLM argv reader is engines/vllm/argv.py."""
from __future__ import annotations


def argv_fields(argv: list[str], names: list[str]) -> list[str]:
    """EngineArgs fields named by flags on a command line (``--max-model-len 8k``, ``--no-enforce-eager``,
    ``-tp 2``, unique prefixes as argparse allows)."""
    from oomdoctor.engines.vllm.argv import flagged_fields  # noqa: PLC0415

    return flagged_fields(argv, names)
