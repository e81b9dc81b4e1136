"""The gate's results in CI's own formats: GitHub workflow commands (annotations on the changed file and line, a
job-summary Markdown table) and SARIF 2.1.0 for code scanning. The verdicts are :class:`GateResult`'s; this module
only writes them down.

A result points at the line of its file that a reviewer should look at: the first setting the nearest receipt
differs in (``max-num-seqs: 32``), else the first line changed against the gate's base, else the profile's own line (``"long-128k": {``), else line 1.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from oomdoctor import __version__
from oomdoctor.gate.verdict import ConfigResult, GateResult

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
# reason_code → what the rule checks (one SARIF rule each)
RULES: dict[str, str] = {
    "no_receipt": "a changed serving config has no passing real retest of its fingerprint",
    "other_fingerprint": "the receipts found are for other fingerprints: the config changed since its retest",
    "stale": "the receipt was recorded with an older engine version than the one in use",
    "wrong_target": "the retest passed on a device that is not one of the declared targets",
    "not_real": "only a twin (predicted) retest passed; a receipt needs the real engine",
    "not_passing": "the retest of this fingerprint did not pass",
}
_SETTING_RE = re.compile(r"^(?:settings|env|engine_args)\.([A-Za-z0-9_]+)")


def _lines(root: Path, path: str) -> list[str]:
    try:
        return (root / path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


_HUNK_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)")


def first_changed_line(root: Path, path: str, base: str | None) -> int | None:
    """The first line of ``path`` that differs from ``base`` (git's own diff of the working tree), or None."""
    import subprocess

    if not base:
        return None
    try:
        out = subprocess.run(["git", "diff", "--no-color", "-U0", base, "--", path], cwd=root, capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for ln in out.splitlines():
        m = _HUNK_RE.match(ln)
        if m:
            return max(1, int(m.group(1)))
    return None


def locate(root: Path, c: ConfigResult, base: str | None = None) -> int:
    """The 1-based line of ``c.path`` to annotate: the first setting the nearest receipt differs in, else the
    first line changed against ``base``, else the profile's own line, else 1."""
    lines = _lines(root, c.path)
    start = 0
    if c.profile is not None:
        quoted = (f'"{c.profile}"', f"'{c.profile}'", f"{c.profile}:")
        start = next((i for i, ln in enumerate(lines) if any(q in ln for q in quoted)), 0)
    for d in c.diff:
        m = _SETTING_RE.match(d)
        if not m:
            continue
        names = {m.group(1), m.group(1).replace("_", "-"), m.group(1).upper()}
        for i in range(start, len(lines)):
            if any(re.search(rf"(?<![A-Za-z0-9_-]){re.escape(n)}(?![A-Za-z0-9_-])", lines[i]) for n in names):
                return i + 1
    changed = first_changed_line(root, c.path, base) if c.profile is None else None
    return changed or start + 1


def _message(c: ConfigResult) -> str:
    parts = [c.reason] + list(c.diff) + [f"note: {n}" for n in c.notes]
    if c.command:
        parts.append(f"to produce it: {c.command}")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- GitHub
def _esc_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _esc_prop(s: str) -> str:
    return _esc_data(s).replace(":", "%3A").replace(",", "%2C")


def github_annotations(res: GateResult, root: Path) -> list[str]:
    """``::error file=F,line=N,title=T::message`` for each config without a passing retest, ``::notice`` for the
    others (a deleted config is annotated without a line: its file is gone)."""
    out = []
    for c in res.configs:
        level = "notice" if c.status == "pass" else "error"
        title = f"oomdoctor gate: {'passing retest' if c.status == 'pass' else 'no passing retest'} ({c.label})"
        props = [f"file={_esc_prop(c.path)}"]
        if c.change not in ("deleted",) and (root / c.path).is_file():
            props.append(f"line={locate(root, c, res.merge_base or None)}")
        props.append(f"title={_esc_prop(title)}")
        out.append(f"::{level} {','.join(props)}::{_esc_data(_message(c))}")
    for n in res.notes:
        out.append(f"::notice title=oomdoctor gate::{_esc_data(n)}")
    return out


def _cell(s: str | None) -> str:
    return (s or "").replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def job_summary(res: GateResult) -> str:
    """The Markdown table for ``$GITHUB_STEP_SUMMARY``."""
    failed = sum(1 for c in res.configs if c.status != "pass")
    head = (f"### oomdoctor gate: {'FAIL' if failed else 'PASS'}\n\n"
            f"Base `{res.base}` (merge-base `{res.merge_base[:12]}`), project `{res.project_file}`: "
            f"{len(res.configs)} changed serving config(s), {failed} without a passing retest.\n")
    if not res.configs:
        return head + "\nNo serving config changed.\n"
    rows = ["| | config | change | fingerprint | why | to produce it |", "| --- | --- | --- | --- | --- | --- |"]
    for c in res.configs:
        mark = "✅ pass" if c.status == "pass" else "❌ fail"
        fp = f"`{c.fingerprint[:19]}…`" if c.fingerprint else ""
        why = _cell("\n".join([c.reason] + list(c.diff)))
        rows.append(f"| {mark} | `{_cell(c.label)}` | {c.change} | {fp} | {why} | "
                    + (f"`{_cell(c.command)}`" if c.command else "") + " |")
    notes = "".join(f"- {_cell(n)}\n" for n in res.notes)
    return head + "\n" + "\n".join(rows) + "\n" + (f"\n{notes}" if notes else "")


# ----------------------------------------------------------------------------- SARIF
def sarif(res: GateResult, root: Path, exit_code: int) -> dict[str, Any]:
    """One SARIF 2.1.0 log: one run of the tool ``oomdoctor``, a rule per reason, a result per failing config."""
    rule_ids = list(RULES)
    results = []
    for c in res.configs:
        if c.status == "pass":
            continue
        code = c.reason_code if c.reason_code in RULES else "no_receipt"
        region = {"startLine": locate(root, c, res.merge_base or None)} if (root / c.path).is_file() else None
        loc: dict[str, Any] = {"artifactLocation": {"uri": c.path, "uriBaseId": "%SRCROOT%"}}
        if region:
            loc["region"] = region
        result: dict[str, Any] = {
            "ruleId": f"oomdoctor.gate.{code}", "ruleIndex": rule_ids.index(code), "level": "error",
            "message": {"text": _message(c)},
            "locations": [{"physicalLocation": loc}],
            "properties": {"profile": c.profile, "change": c.change, "command": c.command},
        }
        if c.fingerprint:
            result["partialFingerprints"] = {"oomdoctorConfigFingerprint/v1": c.fingerprint}
        results.append(result)
    rules = [{"id": f"oomdoctor.gate.{k}", "name": "".join(w.title() for w in k.split("_")),
              "shortDescription": {"text": v}, "defaultConfiguration": {"level": "error"}} for k, v in RULES.items()]
    return {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "oomdoctor", "version": __version__, "semanticVersion": __version__,
                                "rules": rules}},
            "invocations": [{"executionSuccessful": exit_code in (0, 1), "exitCode": exit_code,
                             "toolExecutionNotifications": [{"message": {"text": n}, "level": "note"}
                                                            for n in res.notes]}],
            "results": results,
            "properties": {"base": res.base, "mergeBase": res.merge_base, "projectFile": res.project_file,
                           "passed": res.passed},
        }],
    }
