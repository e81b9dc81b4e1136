"""The gate's text report."""
from __future__ import annotations

from oomdoctor.gate.verdict import GateResult


def render_text(res: GateResult) -> str:
    lines = []
    n = len(res.configs)
    head = f"oomdoctor gate: base {res.base} (merge-base {res.merge_base[:12]}), project {res.project_file}"
    lines.append(head)
    if not n:
        lines.append("no serving config changed")
    for c in res.configs:
        tag = "PASS" if c.status == "pass" else "FAIL"
        what = c.change + (f" from {c.renamed_from}" if c.renamed_from else "")
        lines.append("")
        lines.append(f"{tag}  {c.label}  ({what})")
        if c.fingerprint:
            lines.append(f"      fingerprint: {c.fingerprint}")
        lines.append(f"      why: {c.reason}")
        for d in c.diff:
            lines.append(f"        {d}")
        for note in c.notes:
            lines.append(f"      note: {note}")
        if c.command:
            lines.append(f"      to produce it: {c.command}")
    for note in res.notes:
        lines.append(f"note: {note}")
    failed = sum(1 for c in res.configs if c.status != "pass")
    lines.append("")
    if failed:
        lines.append(f"gate: FAIL: {failed} of {n} changed serving config{'s' if n != 1 else ''} "
                     f"{'has' if failed == 1 else 'have'} no passing retest")
    elif n:
        lines.append(f"gate: PASS: {n} changed serving config{'s' if n != 1 else ''}, each with a passing retest "
                     f"or nothing to verify")
    else:
        lines.append("gate: PASS: no serving config changed")
    return "\n".join(lines)
