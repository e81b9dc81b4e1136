"""``oomdoctor admit`` — KV-aware admission check for one request, with the arithmetic.

    oomdoctor admit --budget SIZE --kv-bytes-per-token N --request PROMPT[:MAX_OUTPUT]
                    [--in-use SIZE] [--queue-ahead N] [--durations-s a,b,c] [--json]

SIZE is bytes (``4942209024``) or a size (``4713MiB``, ``4.6GiB``). The budget is the KV byte budget
fixed at load (``total - resident weights - reserves``), not a live free-memory reading.

Exit codes: 0 admit; 1 queue (fits the budget, not what is free now, or others wait ahead) or
reject (needs more than the whole budget: never admissible) — ``decision`` in the output says
which; 2 bad input.
"""
from __future__ import annotations

import json

import click


def _size(text: str, what: str) -> int:
    from oomdoctor.errors import BadInput
    from oomdoctor.units import parse_size

    try:
        v = parse_size(text)
    except BadInput as e:
        raise BadInput(f"{what}: {e}")
    if v < 0:
        raise BadInput(f"{what} must not be negative, got {text!r}")
    return v


def _tokens(text: str, what: str) -> int:
    from oomdoctor.errors import BadInput
    from oomdoctor.units import parse_int

    try:
        v = parse_int(text.strip())
    except ValueError:
        raise BadInput(f"{what} must be a whole number of tokens, got {text!r}")
    if v < 0:
        raise BadInput(f"{what} must not be negative, got {text!r}")
    return v


def parse_request(text: str) -> tuple[int, int]:
    """``67881:8192`` → (67881, 8192); ``18020`` → (18020, 0)."""
    from oomdoctor.errors import BadInput

    parts = text.split(":")
    if len(parts) > 2 or not parts[0].strip():
        raise BadInput(f"--request must be PROMPT_TOKENS[:MAX_OUTPUT_TOKENS], got {text!r}")
    prompt = _tokens(parts[0], "--request prompt tokens")
    out = _tokens(parts[1], "--request max output tokens") if len(parts) == 2 else 0
    return prompt, out


def parse_durations(text: str | None) -> list[float]:
    from oomdoctor.errors import BadInput

    if not text:
        return []
    out = []
    for item in text.split(","):
        try:
            out.append(float(item.strip()))
        except ValueError:
            raise BadInput(f"--durations-s must be seconds separated by commas (e.g. 70,95,150), got {item!r}")
    return out


@click.command(name="admit")
@click.option("--budget", required=True, metavar="SIZE",
              help="KV byte budget captured at load: total - resident weights - reserves (bytes or e.g. 4713MiB).")
@click.option("--kv-bytes-per-token", "kv_bpt", required=True, metavar="N",
              help="KV cache bytes per token on one card (e.g. 32768).")
@click.option("--request", "request", required=True, metavar="PROMPT[:MAX_OUTPUT]",
              help="Prompt tokens and the reserved max output tokens, e.g. 67881:8192.")
@click.option("--in-use", default="0", show_default=True, metavar="SIZE",
              help="KV bytes of the budget held by admitted requests now.")
@click.option("--queue-ahead", type=click.IntRange(min=0), default=0, show_default=True,
              help="Requests already waiting (FIFO: a new one never overtakes them).")
@click.option("--durations-s", default=None, metavar="A,B,C",
              help="Measured request durations in seconds; the wait deadline is their p95 x queue position.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def command(budget: str, kv_bpt: str, request: str, in_use: str, queue_ahead: int, durations_s: str | None,
            as_json: bool) -> int:
    """Admit, queue or reject one request against a KV byte budget, and show the arithmetic.

    Exit 0 admit; 1 queue or reject (see "decision"); 2 bad input."""
    from oomdoctor.analysis.admission import decide
    from oomdoctor.errors import BadInput

    b = _size(budget, "--budget")
    if b == 0:
        raise BadInput("--budget must be more than 0 bytes")
    try:
        whole = float(kv_bpt.replace(",", "").replace("_", ""))
    except ValueError:
        whole = None
    if whole is not None and whole != int(whole):
        raise BadInput(f"--kv-bytes-per-token must be a whole number of bytes, got {kv_bpt!r}")
    bpt = _size(kv_bpt, "--kv-bytes-per-token")
    if bpt == 0:
        raise BadInput("--kv-bytes-per-token must be more than 0")
    prompt, out = parse_request(request)
    d = decide(b, bpt, prompt, out, in_use_bytes=_size(in_use, "--in-use"), queue_ahead=queue_ahead,
               durations_s=parse_durations(durations_s))
    if as_json:
        click.echo(json.dumps(d.to_dict()))
    else:
        label = {"admit": "ADMIT", "queue": "QUEUE", "reject": "REJECT (permanent)" if d.permanent else "REJECT"}
        click.echo(f"{label[d.verdict]}: {d.reason}")
        for line in d.arithmetic:
            click.echo(f"  {line}")
    return d.exit_code
