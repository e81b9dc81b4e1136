"""`oomdoctor plan`: prints what oomdoctor.levers.plan computes."""
from __future__ import annotations

import json

import click

from oomdoctor.engines.vllm import memory as M
from oomdoctor.levers.plan import plan
from oomdoctor.units import human_bytes

# ---------------------------------------------------------------------------------------------------
# The click verb
# ---------------------------------------------------------------------------------------------------

def _human(result: dict) -> str:
    g = lambda b: human_bytes(b) if isinstance(b, (int, float)) else "-"  # noqa: E731
    s = result["settings"]
    rows = [
        ("model", f"{result['model']['architecture']} ({result['model']['dtype']}), {result['model']['path']}"),
        ("gpu", f"{result['gpu']['name'] or 'total'} {g(result['gpu']['total_bytes'])}, free at start "
                f"{g(result['gpu']['startup_free_bytes'])} (as vLLM sees it)"),
        ("settings", f"util {s['gpu_memory_utilization']}, max_model_len {s['max_model_len']:,}, "
                     f"batched tokens {s['max_num_batched_tokens']}, seqs {s['max_num_seqs']}, kv {s['kv_cache_dtype']}, "
                     f"tp {s['tensor_parallel_size']}"),
        ("weights", f"{g(result['weights_bytes'])} ({result['weights_source']}; RoPE cache {g(result['rope_cache_bytes'])})"),
        ("requested", f"{g(result['requested_bytes'])} (check {'ok' if result['startup_check_ok'] else 'FAILS'})"),
        ("activation", f"{g(result['activation_peak_bytes'])} + overhead {g(result['profile_overhead_bytes'])}"),
        ("KV arena", f"{g(result['available_kv_bytes'])}, {result['kv_bytes_per_token']:,} B/token"),
        ("KV capacity", f"{result['kv_tokens']:,} tokens, {result['max_concurrency']:.2f}x at "
                        f"{result['max_model_len']:,} tokens; largest max_model_len that fits "
                        f"{result['max_model_len_that_fits']:,}"),
        ("verdict", "fits" if result["fits"] else
         f"does not fit: {result['failure']['class']}: {result['failure']['reason']}"),
    ]
    for i, lev in enumerate(result["levers"]):
        ch = ", ".join(f"{k}={v}" for k, v in lev["change"].items())
        rows.append((f"lever {i + 1}", f"{ch} -> {'fits' if lev['predicted']['fits'] else lev['predicted']['failure']}; "
                                       f"{lev['predicted']['kv_tokens']:,} KV tokens; cost: {lev['cost']}"))
    return _table(rows)


def _table(rows: list[tuple[str, str]]) -> str:
    """``key  value`` rows at the terminal's width, values wrapped at spaces only (a number is never cut)."""
    import shutil

    from oomdoctor.diagnose.screen import wrap

    width = min(max(shutil.get_terminal_size((80, 24)).columns, 60), 120)
    key_w = max(len(k) for k, _ in rows)
    lines: list[str] = []
    for k, v in rows:
        lines += wrap(v, width, indent=" " * (key_w + 2), first=f"{k:<{key_w}}  ")
    return "\n".join(lines)


@click.command("plan", help="Memory arithmetic before any failure: will this model start on this card, and with what.")
@click.option("--model", "model", required=True, type=click.Path(), help="HF-style model directory (config.json)")
@click.option("--gpu-memory", required=True, help="GPU total: bytes, a size (24GiB) or a card (rtx4090, h200)")
@click.option("--free", default=None, help="free memory before the start (default: an idle card)")
@click.option("--max-model-len", default=None, help="tokens (32768, 32k, 32K) or auto")
@click.option("--gpu-memory-utilization", type=float, default=None, help="fraction of TOTAL memory (default 0.92)")
@click.option("--kv-cache-dtype", default=None, help="auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16, nvfp4, ...")
@click.option("--max-num-seqs", default=None)
@click.option("--max-num-batched-tokens", default=None)
@click.option("--kv-cache-memory-bytes", default=None, help="pin the KV arena (profiling is then skipped)")
@click.option("--tensor-parallel-size", type=int, default=None)
@click.option("--engine-version", default=M.DEFAULT_ENGINE_VERSION, show_default=True)
@click.option("--usage-context", type=click.Choice(["serve", "llm"]), default="serve", show_default=True,
              help="vllm serve or the offline LLM() class (their batch defaults differ)")
@click.option("--block-size", type=int, default=None)
@click.option("--enforce-eager", is_flag=True, default=False)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def command(model: str, gpu_memory: str, free: str | None, max_model_len: str | None,
            gpu_memory_utilization: float | None, kv_cache_dtype: str | None, max_num_seqs: str | None,
            max_num_batched_tokens: str | None, kv_cache_memory_bytes: str | None, tensor_parallel_size: int | None,
            engine_version: str, usage_context: str, block_size: int | None, enforce_eager: bool, as_json: bool) -> int:
    result = plan(model, gpu_memory, free=free, max_model_len=max_model_len,
                  gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype,
                  max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                  kv_cache_memory_bytes=kv_cache_memory_bytes, tensor_parallel_size=tensor_parallel_size,
                  engine_version=engine_version, usage_context=usage_context, block_size=block_size,
                  enforce_eager=enforce_eager)
    click.echo(json.dumps(result, indent=2) if as_json else _human(result))
    return 0 if result["fits"] else 1
