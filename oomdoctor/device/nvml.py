"""Device state: NVML (pynvml) for every visible GPU and the processes holding its memory.

Where NVML cannot be used (no package, no driver, no GPU) the state says ``unavailable`` and
why — never a guess. Nothing here imports torch.
"""
from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Any


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _s(x: Any) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else str(x)


def _proc_name(pid: int, nvml: Any) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace").strip()[:200] \
            or Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        pass
    try:
        return _s(nvml.nvmlSystemGetProcessName(pid))[:200]
    except Exception:  # noqa: BLE001
        return ""


def unavailable(reason: str) -> dict:
    return {"status": "unavailable", "reason": reason, "source": "nvml", "captured_at": _now(), "gpus": []}


def capture(with_processes: bool = True) -> dict:
    """NVML snapshot of every GPU: name, uuid, total/free/used bytes, holders of memory."""
    if os.environ.get("OOMDOCTOR_NO_NVML"):
        return unavailable("NVML disabled by OOMDOCTOR_NO_NVML")
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as e:
        return unavailable(f"pynvml (nvidia-ml-py) is not installed: {e}")
    try:
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return unavailable(f"NVML could not be initialised: {_s(e) or type(e).__name__}")
    try:
        state: dict[str, Any] = {"status": "captured", "reason": "", "source": "nvml", "captured_at": _now(), "gpus": []}
        try:
            state["driver_version"] = _s(pynvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001
            pass
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            state["cuda_visible_devices"] = cvd
        n = pynvml.nvmlDeviceGetCount()
        for i in range(n):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            g: dict[str, Any] = {"index": i, "name": _s(pynvml.nvmlDeviceGetName(h)),
                                 "total_bytes": int(mem.total), "free_bytes": int(mem.free), "used_bytes": int(mem.used)}
            try:
                g["uuid"] = _s(pynvml.nvmlDeviceGetUUID(h))
            except Exception:  # noqa: BLE001
                pass
            if with_processes:
                procs = []
                try:
                    running = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                except Exception as e:  # noqa: BLE001
                    g["processes_unavailable"] = _s(e) or type(e).__name__
                    running = []
                for p in running:
                    used = getattr(p, "usedGpuMemory", None)
                    procs.append({"pid": int(p.pid), "name": _proc_name(int(p.pid), pynvml),
                                  "used_bytes": int(used) if isinstance(used, int) else None})
                g["processes"] = procs
            state["gpus"].append(g)
        if n == 0:
            return unavailable("NVML found no GPU")
        return state
    except Exception as e:  # noqa: BLE001
        return unavailable(f"NVML query failed: {_s(e) or type(e).__name__}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def free_bytes(state: dict, index: int = 0) -> int | None:
    for g in state.get("gpus", []):
        if g.get("index") == index:
            return g.get("free_bytes")
    return None


def log_device_statements(numbers: dict, numbers_source: dict) -> list[dict]:
    """Device figures the LOG states (kept apart from NVML's, each with the line it came from)."""
    out = []
    if "free_at_start_bytes" in numbers:
        d = {"source": f"log line {numbers_source.get('free_at_start_bytes')}", "what": "free memory at start (vLLM's check)",
             "free_bytes": numbers["free_at_start_bytes"]}
        if "gpu_total_bytes" in numbers:
            d["total_bytes"] = numbers["gpu_total_bytes"]
        out.append(d)
    if "gpu_free_bytes" in numbers:
        d = {"source": f"log line {numbers_source.get('gpu_free_bytes')}", "what": "free memory at the OOM (torch)",
             "free_bytes": numbers["gpu_free_bytes"]}
        for k in ("gpu_total_bytes", "oom_gpu_index", "other_process_pid", "other_process_bytes", "process_in_use_bytes"):
            if k in numbers:
                d[k.replace("gpu_", "") if k == "gpu_total_bytes" else k] = numbers[k]
        out.append(d)
    if "initial_free_bytes" in numbers:
        out.append({"source": f"log line {numbers_source.get('initial_free_bytes')}", "what": "initial free memory (vLLM worker)",
                    "free_bytes": numbers["initial_free_bytes"]})
    return out
