"""Verifying a passing attempt from its own log: a receipt is believed only as far as its run's log shows it.

``verify_attempt(attempt, base, effective_config)`` → the problems ([] = verified):

1. the attempt names its log (``log_path``, relative to the receipt or card) and its ``log_sha256``, and the file
   is a regular file with that hash;
2. the log, diagnosed again, shows a clean run: no memory failure, no other failure, and requests served
   (oomdoctor's own ``OOMDOCTOR_RESULT`` line, the API server's ``POST /v1/... 200`` lines, or vLLM's offline
   ``Processed prompts: 100% N/N``);
3. the effective config recomputed from the log's OWN config lines — the engine version it printed, its
   ``non-default args`` (model, revision, memory settings), the memory-shaping environment of oomdoctor's run header,
   and the free memory at start against a ``requires_free_bytes`` condition — has the attempt's fingerprint.

A log can still be written by hand; what a hand cannot fake without a key is a signature (:mod:`.signing`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from oomdoctor.card.fingerprint import MEMORY_ENV, diff, effective_config, fingerprint

RESULT_RE = re.compile(r"OOMDOCTOR_RESULT (\{.*\})")
ACCESS_RE = re.compile(r'"POST /v1/[a-z/_]{1,40} HTTP/1\.[01]" (\d{3})')
OFFLINE_RE = re.compile(r"Processed prompts: 100%\|[^|\n]{0,80}\| (\d{1,9})/(\d{1,9})")
FREE_TOLERANCE = 512 << 20


def run_passed(klass: str, is_memory_failure: bool, served: bool) -> bool:
    """One rule for `record` (what it writes) and the gate (what it believes): served, and no failure at all."""
    return bool(served) and not is_memory_failure and klass not in ("not_memory", "cascade_only")


def served_in_log(path: Path) -> tuple[bool, str]:
    """(the log shows the requests served, how)."""
    from oomdoctor.diagnose.read import iter_lines

    ok = bad = 0
    offline = result = None
    for _, raw in iter_lines(path):
        line = raw.decode("utf-8", errors="replace")[:4096]
        m = RESULT_RE.search(line)
        if m:
            try:
                result = json.loads(m.group(1))
            except ValueError:
                result = None
        for code in ACCESS_RE.findall(line):
            ok, bad = (ok + 1, bad) if code.startswith("2") else (ok, bad + 1)
        m2 = OFFLINE_RE.search(line)
        if m2:
            offline = (int(m2.group(1)), int(m2.group(2)))
    if isinstance(result, dict) and isinstance(result.get("requests"), int):
        n, s = int(result["requests"]), result.get("served")
        return (n > 0 and s == n), f"OOMDOCTOR_RESULT: {s} of {n} requests served"
    if ok or bad:
        return (ok > 0 and bad == 0), f"API server: {ok} POST /v1 answered 2xx, {bad} not"
    if offline:
        return offline[0] == offline[1] > 0, f"offline: {offline[0]}/{offline[1]} prompts processed"
    return False, "no served request in the log"


def _engine_args(matches: list) -> dict[str, Any]:
    from oomdoctor.card.workload import parse_engine_args

    for m in matches:
        if "engine_args" in m.groups:
            return parse_engine_args(m.groups["engine_args"])
    return {}


def _free_at_start(header: dict[str, Any]) -> int | None:
    nv = header.get("nvml_before_start")
    if isinstance(nv, dict) and isinstance(nv.get("free"), int):
        return int(nv["free"])
    b = header.get("ballast")
    if isinstance(b, dict) and isinstance(b.get("nvml_free"), int):
        return int(b["nvml_free"])
    return None


def config_from_log(path: Path, diag: Any, claimed: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The effective config the log's own lines show (and the problems met on the way)."""
    from oomdoctor.card.workload import read_header

    problems: list[str] = []
    explicit = _engine_args(diag.matches)
    if not explicit:
        problems.append("the log has no `non-default args` line: its settings cannot be read from it")
    header = read_header(path)
    raw_env = header.get("env")
    env = {str(k): str(v) for k, v in raw_env.items() if k in MEMORY_ENV} if isinstance(raw_env, dict) else {}
    model = explicit.get("model_tag") or explicit.get("model")
    args = {k: v for k, v in explicit.items() if k not in ("model", "model_tag", "revision")}
    cond = dict(claimed.get("conditions") or {})
    need = cond.get("requires_free_bytes")
    if need is not None:
        free = _free_at_start(header)
        if free is None:
            problems.append("the config promises requires_free_bytes but the log does not show the free memory at start")
        elif free > int(need) + FREE_TOLERANCE:
            problems.append(f"the run started with {free} bytes free, more than the {need} the config promises")
    ec = effective_config(diag.engine or "unknown", diag.engine_version, None if model is None else str(model),
                          explicit.get("revision"), args, env, conditions=cond or None)
    return ec, problems


def verify_log(log: Path, expected_sha: str | None, claimed: dict[str, Any]) -> list[str]:
    """Problems of one passing claim for the effective config ``claimed``, read from the run's log."""
    from oomdoctor.card.locking import refuse_special
    from oomdoctor.diagnose.classify import diagnose_file
    from oomdoctor.diagnose.read import file_sha256
    from oomdoctor.diagnose.rules import default_rules
    from oomdoctor.errors import OomdoctorError

    try:
        refuse_special(log, "log")
        if not log.is_file():
            return [f"its log {log.name} is not there (the retest's log travels with the receipt)"]
        if expected_sha is None:
            return ["it records no log_sha256"]
        if file_sha256(log) != expected_sha:
            return [f"its log {log.name} does not have the recorded sha256 (changed after the run?)"]
        diag = diagnose_file(log, default_rules(), engine=claimed.get("engine"))
    except OomdoctorError as e:
        return [f"its log cannot be read ({e})"]
    served, how = served_in_log(log)
    problems = []
    if not run_passed(diag.klass, diag.is_memory_failure, served):
        problems.append(f"its log does not show a clean run ({diag.klass}" + (f", {diag.rule}" if diag.rule else "")
                        + f"; {how})")
    ec, more = config_from_log(log, diag, claimed)
    problems += more
    if fingerprint(ec) != fingerprint(claimed):
        d = diff(ec, claimed)
        problems.append("the config in its log is not this one (log → receipt: " + "; ".join(d[:4])
                        + (f"; {len(d) - 4} more" if len(d) > 4 else "") + ")")
    return problems


def verify_attempt(attempt: dict[str, Any], base: Path, claimed: dict[str, Any]) -> list[str]:
    """``verify_log`` for an attempt of a receipt or card at ``base`` (the file its log_path is relative to)."""
    lp = attempt.get("log_path")
    if not isinstance(lp, str) or not lp:
        return ["it names no log (log_path): nothing shows that it ran"]
    p = Path(lp)
    if p.is_absolute() or ".." in p.parts:
        return [f"its log_path {lp!r} is not inside the receipt's folder"]
    sha = attempt.get("log_sha256")
    return verify_log(base.parent / p, sha if isinstance(sha, str) else None, claimed)
