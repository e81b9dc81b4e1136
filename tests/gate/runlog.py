"""A run's log for a config the H200 never ran (the gate-logic tests need one per config and profile)."""
from __future__ import annotations

import json
from pathlib import Path

from oomdoctor.card import fingerprint as fpmod

ROOT = Path(__file__).resolve().parents[2]
REAL_RUN = ROOT / "incidents" / "h200-D_fail.runs" / "attempt-2-kv_cache_memory_bytes.log"   # a real passing retest


def run_log(tmp: Path, ec: dict) -> Path:
    """A log for a run of ``ec``: the REAL passing H200 retest log REAL_RUN with its config lines (run header env,
    `non-default args`, engine version, free memory at start) rewritten to ``ec`` — what a deliberate forger can do
    too, which is why the project can require signatures (test_signed_receipts). The gate-logic tests need a log
    per config; the tests of verification itself use real logs unchanged (tests/gate/test_receipts.py)."""
    args = {"model": ec["model"], **ec["settings"], **({"revision": ec["model_revision"]} if ec["model_revision"] else {})}
    out = []
    for line in REAL_RUN.read_text().splitlines(keepends=True):
        if line.startswith("# env: "):
            line = "# env: " + json.dumps(ec["env"], sort_keys=True) + "\n"
        elif line.startswith("# nvml before start: ") and (ec.get("conditions") or {}).get("requires_free_bytes"):
            line = "# nvml before start: " + json.dumps({"free": ec["conditions"]["requires_free_bytes"]}) + "\n"
        elif "non-default args: {" in line:
            line = line.split("non-default args: ")[0] + f"non-default args: {args!r}\n"
        out.append(line.replace("0.25.1", str(ec["engine_version"])))
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / f"run-{fpmod.fingerprint(ec)[7:19]}-{len(list(tmp.iterdir()))}.log"
    log.write_text("".join(out))
    return log
