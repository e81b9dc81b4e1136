"""Verdicts: one serving config against the receipts and cards found → pass, or why not and what to run."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from oomdoctor.card import fingerprint as fpmod
from oomdoctor.card import receipt as rcpt
from oomdoctor.gate.configs import ServingConfig
from oomdoctor.gate.project import PROJECT_FILE, Project

# ----------------------------------------------------------------------------- verdicts
@dataclass
class ConfigResult:
    path: str
    profile: str | None
    kind: str
    change: str                     # added | modified | renamed | deleted | profile_removed
    status: str                     # pass | fail
    reason_code: str                # receipt | deleted | no_receipt | other_fingerprint | stale | wrong_target | not_real
                                    # | not_passing | unverified | unsigned | undeclared
    reason: str
    fingerprint: str | None
    command: str | None
    renamed_from: str | None = None
    receipt: dict | None = None
    diff: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.path} [{self.profile}]" if self.profile is not None else self.path

    def to_dict(self) -> dict:
        return {"path": self.path, "profile": self.profile, "status": self.status, "fingerprint": self.fingerprint,
                "reason": self.reason, "command": self.command, "kind": self.kind, "change": self.change,
                "renamed_from": self.renamed_from, "reason_code": self.reason_code, "receipt": self.receipt,
                "diff": self.diff, "notes": self.notes}


@dataclass
class GateResult:
    base: str
    base_commit: str
    merge_base: str
    project_file: str
    configs: list[ConfigResult]
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status == "pass" for c in self.configs)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_dict(self) -> dict:
        return {"passed": self.passed, "configs": [c.to_dict() for c in self.configs], "base": self.base,
                "base_commit": self.base_commit, "merge_base": self.merge_base, "project_file": self.project_file,
                "notes": self.notes}


def record_command(sc: ServingConfig, project: Project | None = None) -> str:
    """The command that produces the missing receipt."""
    parts = ["oomdoctor", "record", "--serving-config", sc.path]
    if sc.profile is not None:
        parts += ["--profile", sc.profile]
    parts += ["--target", sc.targets[0]]
    if project is not None and project.rel != PROJECT_FILE:
        parts += ["--config", project.rel or project.origin]
    return " ".join(shlex.quote(p) for p in parts)


class Verdict(NamedTuple):
    status: str                     # pass | fail
    reason_code: str
    reason: str
    receipt: dict | None
    diff: list[str]


def _same_except_version(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "engine_version"} == {k: v for k, v in b.items() if k != "engine_version"}


def _exact_verdict(exact: list[rcpt.FoundAttempt], targets: list[str], root: Path | None, signed: Any) -> Verdict:
    """Attempts of this very fingerprint exist, none passing on a target: say which way they fall short."""
    tl = ", ".join(targets)
    claims = [a for a in exact if a.claims_pass(targets)]
    ok = [a for a in claims if not a.unverified() and signed(a)]
    if ok:
        a = ok[0]
        return Verdict("pass", "receipt", f"passing retest: {a.describe(root)}", _receipt_info(a, root), [])
    if claims:
        a = claims[0]
        why = a.unverified()
        if not why:
            return Verdict("fail", "unsigned", f"{a.describe(root)} passed, but {signed.why(a)}", _receipt_info(a, root), [])
        return Verdict("fail", "unverified", f"{a.describe(root)} says it passed, but {why[0]}"
                       + (f" (and {len(why) - 1} more)" if len(why) > 1 else ""), _receipt_info(a, root), [])
    wrong_target = [a for a in exact if a.outcome == "pass" and a.mode == "real"]
    twin = [a for a in exact if a.outcome == "pass" and a.mode != "real"]
    if wrong_target:
        a = wrong_target[0]
        return Verdict("fail", "wrong_target", f"the retest of this fingerprint passed on "
                       f"{a.target_device or 'an unnamed device'} ({a.describe(root)}), but a receipt must be for {tl}",
                       _receipt_info(a, root), [])
    if twin:
        a = twin[0]
        return Verdict("fail", "not_real", f"only a {a.mode or 'unspecified-mode'} retest of this fingerprint passed "
                       f"({a.describe(root)}); a receipt needs the real engine (mode 'real')", _receipt_info(a, root), [])
    a = exact[0]
    return Verdict("fail", "not_passing", f"the retest of this fingerprint did not pass (outcome {a.outcome!r}: "
                   f"{a.describe(root)})", _receipt_info(a, root), [])


def _nearest_verdict(sc: ServingConfig, newest: list[rcpt.FoundAttempt], root: Path | None) -> Verdict:
    """No attempt of this fingerprint: a stale receipt (older engine), the nearest other one, or none."""
    ec, targets = sc.effective_config, sc.targets
    eligible = [(a, a.effective_config) for a in newest if a.claims_pass(targets) and a.effective_config is not None]
    stale = [(a, aec) for a, aec in eligible if _same_except_version(aec, ec)
             and rcpt.compare_versions(aec.get("engine_version"), sc.engine_version) == -1]
    if stale:
        a, aec = stale[0]
        return Verdict("fail", "stale", f"stale receipt: {a.describe(root)} was recorded with {sc.engine} "
                       f"{aec.get('engine_version')}; the engine in use is {sc.engine} {sc.engine_version}",
                       _receipt_info(a, root), fpmod.diff(aec, ec))
    if eligible:
        a, aec = min(eligible, key=lambda x: len(fpmod.diff(x[1], ec)))
        d = fpmod.diff(aec, ec)
        return Verdict("fail", "other_fingerprint", f"receipt for another fingerprint: the nearest, {a.describe(root)}, "
                       f"differs in {len(d)} setting{'s' if len(d) != 1 else ''} (receipt → this config):",
                       _receipt_info(a, root), d)
    return Verdict("fail", "no_receipt", f"no receipt: no passing real retest on {', '.join(targets)} for this "
                   f"fingerprint", None, [])


class _AnySignature:
    """No signers configured: every attempt counts as signed."""

    def __call__(self, a: rcpt.FoundAttempt) -> bool:
        return True

    def why(self, a: rcpt.FoundAttempt) -> str:
        return ""


def verdict(sc: ServingConfig, attempts: list[rcpt.FoundAttempt], root: Path | None = None,
            signatures: Any = None) -> Verdict:
    """(status, reason_code, reason, receipt, diff) for one serving config against every attempt found.
    ``signatures`` (gate/signing.Signatures) decides whether an attempt's file carries a signature of a signer."""
    signed = signatures or _AnySignature()
    newest = sorted(attempts, key=lambda a: a.at, reverse=True)
    exact = [a for a in newest if a.fingerprint == sc.fingerprint and a.consistent and not a.problems]
    return _exact_verdict(exact, sc.targets, root, signed) if exact else _nearest_verdict(sc, newest, root)


def _receipt_info(a: rcpt.FoundAttempt, root: Path | None) -> dict:
    where = a.where(root).rsplit(" attempt ", 1)[0]
    return {"path": where, "kind": a.kind, "attempt": a.n, "fingerprint": a.fingerprint, "outcome": a.outcome,
            "mode": a.mode, "engine_version": a.engine_version, "target_device": a.target_device, "at": a.at or None}
