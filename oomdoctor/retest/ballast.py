"""A ballast process: hold GPU memory so that about TARGET bytes stay free, then sleep until killed.

This is how a 24 GiB owner's failure is reproduced on a bigger GPU (``--emulate rtx4090``), and how
a co-tenant recorded in an incident is reproduced. Run as its own process (it imports torch):

    python -m oomdoctor.retest.ballast TARGET_FREE_BYTES READY_JSON [--index N]

It writes READY_JSON ({"target_free", "held_bytes", "nvml_free", "nvml_total", ...}) when done.
"""
from __future__ import annotations

import json
import os
import sys
import time

MiB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    index = 0
    if "--index" in argv:
        i = argv.index("--index")
        index = int(argv[i + 1])
        del argv[i:i + 2]
    target = int(float(argv[0]))
    ready = argv[1]
    import torch  # noqa: PLC0415 - only in the ballast process

    torch.cuda.set_device(0)   # CUDA_VISIBLE_DEVICES pins the physical GPU
    bufs = []
    for _ in range(8):
        free, total = torch.cuda.mem_get_info()
        need = free - target
        if need <= 4 * MiB:
            break
        chunk = need - 64 * MiB if need > 512 * MiB else need
        chunk = (chunk // (2 * MiB)) * (2 * MiB)
        if chunk <= 0:
            break
        bufs.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    info = {"target_free": target, "held_bytes": sum(b.numel() for b in bufs), "torch_free": free, "torch_total": total,
            "pid": os.getpid(), "nvml_index": index}
    try:
        import pynvml

        pynvml.nvmlInit()
        m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
        info.update(nvml_free=int(m.free), nvml_total=int(m.total))
    except Exception as e:  # noqa: BLE001
        info["nvml_error"] = str(e)
    tmp = ready + ".tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, ready)
    print("BALLAST_READY", json.dumps(info), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
