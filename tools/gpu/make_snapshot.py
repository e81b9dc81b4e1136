#!/usr/bin/env python3
"""Make a real PyTorch memory snapshot that ends in a fragmentation OOM (for oomdoctor's fixtures).

Usage (on a GPU machine with torch; written for torch 2.11 on an H200, Python 3.12):

    python tools/gpu/make_snapshot.py fixtures/snapshots/h200_oom.pickle

What it does, in a few seconds, with plain cudaMalloc through torch's caching allocator
(no managed memory, no kernels: tensors are ``torch.empty``):

1. records the allocator history (``torch.cuda.memory._record_memory_history(max_entries=100000)``);
2. ``load_weights``: fills the card in 4 GiB blocks, leaving room for the next steps;
3. ``reserve_kv_arena``: one 16 x KV_BLOCK tensor, freed again: a cached segment;
4. ``alloc_kv_blocks``: 16 tensors of KV_BLOCK carved out of that cached segment;
5. ``alloc_activations``: fills the rest of the card until about KV_BLOCK stays free;
6. ``free_every_other_kv_block``: 8 holes of KV_BLOCK inside one segment (reserved, unallocated,
   never contiguous), which the allocator cannot give back to the driver;
7. ``too_large_request``: asks for 2 x KV_BLOCK: it fits the 8 free holes together but no single
   one, and the driver has less than that free → torch.OutOfMemoryError;
8. catches it, dumps the snapshot to argv[1] (``torch.cuda.memory._dump_snapshot``) while the
   tensors are still held, prints ONE line of JSON and exits 0.

PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF are removed for this process (expandable segments
would change the picture); the JSON says what they were. Exit 1 if no OOM happened, 2 for usage.
"""
from __future__ import annotations

import json
import os
import sys
import time

GiB = 1 << 30
MiB = 1 << 20
N_KV = 16
MAX_EXTRA_TRIES = 32

_SAVED_CONF = {k: os.environ.pop(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if k in os.environ}

import torch  # noqa: E402 - after the allocator config is cleared

OOM = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
DEV = torch.device("cuda", 0)


def _free_now() -> int:
    return torch.cuda.mem_get_info(DEV)[0]


def _round_down(n: int, unit: int = 2 * MiB) -> int:
    return int(max(0, n // unit * unit))


def load_weights(nbytes: int) -> list:
    out = []
    while nbytes > 0:
        chunk = min(4 * GiB, nbytes)
        out.append(torch.empty(chunk, dtype=torch.uint8, device=DEV))   # each site calls torch itself,
        nbytes -= chunk                                                   # so the snapshot names it
    return out


def reserve_kv_arena(kv_block: int) -> None:
    arena = torch.empty(N_KV * kv_block, dtype=torch.uint8, device=DEV)
    del arena                         # the segment stays cached by the allocator


def alloc_kv_blocks(kv_block: int) -> list:
    return [torch.empty(kv_block, dtype=torch.uint8, device=DEV) for _ in range(N_KV)]


def alloc_activations(leave: int) -> list:
    out = []
    while True:
        chunk = min(4 * GiB, _round_down(_free_now() - leave))
        if chunk < 2 * MiB:
            return out
        out.append(torch.empty(chunk, dtype=torch.uint8, device=DEV))


def free_every_other_kv_block(kv: list) -> list:
    return [t for i, t in enumerate(kv) if i % 2 == 1]   # drop 0, 2, 4, ... → 8 separate holes


def too_large_request(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=DEV)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print("usage: make_snapshot.py OUT.pickle", file=sys.stderr)
        return 2
    out_path = argv[1]
    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "no CUDA device visible to torch"}))
        return 2
    t0 = time.monotonic()
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info(DEV)
    kv_block = GiB if free0 >= 48 * GiB else 256 * MiB
    torch.cuda.memory._record_memory_history(max_entries=100000)

    weights = load_weights(_round_down(free0 - N_KV * kv_block - 8 * GiB if free0 >= 48 * GiB
                                       else free0 // 2))
    reserve_kv_arena(kv_block)
    kv = alloc_kv_blocks(kv_block)
    acts = alloc_activations(leave=kv_block)
    kv = free_every_other_kv_block(kv)
    held: list = []
    request = 2 * kv_block
    oom_msg = None
    for _ in range(MAX_EXTRA_TRIES):
        try:
            held.append(too_large_request(request))    # should fail at once; if not, keep asking
        except OOM as e:
            oom_msg = " ".join(str(e).split())
            break
    torch.cuda.synchronize(DEV)
    allocated = torch.cuda.memory_allocated(DEV)
    reserved = torch.cuda.memory_reserved(DEV)
    free_after = _free_now()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    torch.cuda.memory._dump_snapshot(out_path)
    torch.cuda.memory._record_memory_history(enabled=None)
    summary = {
        "ok": oom_msg is not None,
        "snapshot": out_path,
        "snapshot_file_bytes": os.path.getsize(out_path),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(DEV),
        "total_bytes": total,
        "free_at_start_bytes": free0,
        "free_at_oom_bytes": free_after,
        "allocated_bytes": allocated,
        "reserved_bytes": reserved,
        "reserved_unallocated_bytes": reserved - allocated,
        "kv_block_bytes": kv_block,
        "requested_bytes": request,
        "extra_successful_requests": len(held),
        "expected": {"largest_free_block_bytes": kv_block, "free_holes": N_KV // 2,
                     "holes_bytes": (N_KV // 2) * kv_block},
        "tensors": {"weights": len(weights), "kv": len(kv), "activations": len(acts)},
        "alloc_conf_removed": _SAVED_CONF,
        "oom_message": oom_msg,
        "seconds": round(time.monotonic() - t0, 3),
    }
    print(json.dumps(summary))
    del weights, kv, acts, held
    torch.cuda.empty_cache()
    return 0 if oom_msg is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
