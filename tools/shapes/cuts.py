"""Cut real engine logs the way people paste them, and check each cut reads as its log (issue 12).

The held-out sets measure unseen pastes, but public text holds few engine memory failures. The real logs this
project recorded on an H200 (fixtures/logs/vllm-0.25.1-h200*) hold every start-up phase; a paste in a bug report
is such a log cut down: a tail, the traceback only, the one exception line, one process's lines, the lines
without vLLM's process prefix or its level-and-time prefix, quoted in Markdown, with CRLF endings. This script
makes those cuts of every real log and diagnoses each with the code path of ``oomdoctor diagnose``.

A cut holding the root line must keep the log's class (the phase may be less certain: it is reported, not
required). A cut without the root line may be read as its own outcome (cascade_only, the log's class, or clean
where the cut holds no failure at all) but never as another memory failure. A clean log's cut is never a memory
failure.

    python tools/shapes/cuts.py            # the table of misses and the totals
    python tools/shapes/cuts.py --json     # one JSON object
    python tools/shapes/cuts.py --show LOG:CUT   # print one cut
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from oomdoctor.diagnose.classify import diagnose_file  # noqa: E402
from oomdoctor.diagnose.rules import default_rules  # noqa: E402
from oomdoctor import contract  # noqa: E402

LOG_DIRS = ("vllm-0.25.1-h200", "vllm-0.25.1-h200-evening", "vllm-0.25.1-h200-night", "vllm-0.25.1-h200-dawn",
            "vllm-0.25.1-h200-morning")
TAILS = (3, 5, 10, 20, 40, 80, 160)
WRAP = 120                   # a terminal's or a web console's hard wrap
PROC = re.compile(r"^\((?:EngineCore|APIServer|VllmWorker|Worker)[^)]{0,60}\) ")
LEVEL = re.compile(r"^(\([^)]{1,60}\) )?(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
                   r"\[[\w./-]{1,80}:\d{1,6}\] ")


@dataclass
class Cut:
    name: str
    lines: list[str]
    has_root: bool


def engine_lines(text: str) -> list[str]:
    """The engine's own output: the harness's `# ` header lines and its RUN_LLM line are not part of a paste."""
    return [t for t in text.splitlines() if not t.startswith("# ") and not t.startswith("RUN_LLM ")]


def traceback_start(lines: list[str], root: int) -> int:
    for i in range(root, -1, -1):
        if "Traceback (most recent call last)" in lines[i]:
            return i
    return root


def cuts_of(lines: list[str], root: int | None) -> list[Cut]:
    """Every cut of one log; `root` is the 0-based index of the full log's root line (None: no failure)."""
    n = len(lines)
    out: list[Cut] = []

    def add(name: str, lo: int, hi: int, edit: Callable[[str], str] | None = None) -> None:
        part = lines[lo:hi]
        if edit:
            part = [edit(t) for t in part]
        if part:
            out.append(Cut(name, part, root is not None and lo <= root < hi))

    for k in TAILS:
        if k < n:
            add(f"tail{k}", n - k, n)
    if root is not None:
        tb = traceback_start(lines, root)
        add("traceback", tb, root + 1)
        add("traceback+5", tb, min(n, root + 6))
        add("root_only", root, root + 1)
        add("window30", max(0, root - 30), min(n, root + 30))
        add("from_root", root, n)
    add("no_proc_prefix", 0, n, lambda t: PROC.sub("", t))
    add("no_level_prefix", 0, n, lambda t: LEVEL.sub("", t))
    add("markdown_quote", 0, n, lambda t: "> " + t)
    add("indented", 0, n, lambda t: "    " + t)
    add("crlf", 0, n, lambda t: t + "\r")
    if root is not None:
        errs = [i for i in range(n) if "Error" in lines[i] or "error" in lines[i]]
        out.append(Cut("error_lines", [lines[i] for i in errs], root in errs))
    wrapped = [t[j:j + WRAP] for t in lines for j in range(0, max(len(t), 1), WRAP)]
    out.append(Cut(f"wrap{WRAP}", wrapped, root is not None))
    fence = ["```"] + lines[max(0, n - 40):] + ["```"]
    out.append(Cut("fenced_tail40", fence, root is not None and root >= n - 40))
    if root is not None:
        # the exception's text printed again (a process's own traceback after the logger's copy) is the root too
        said = _exception_text(lines[root])
        for c in out:
            c.has_root = c.has_root or any(said in t for t in c.lines)
    return out


def _exception_text(line: str) -> str:
    """The root line's exception text, without vLLM's process and level prefixes."""
    return LEVEL.sub("", PROC.sub("", line))[:160]


def diagnose(lines: list[str], name: str, rules):
    """``oomdoctor diagnose FILE``'s code path (the paste readers included) on the cut written to a file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / (re.sub(r"[^\w.-]", "_", name) + ".log")
        path.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="")
        return diagnose_file(path, rules)


def judge(full, d, cut: Cut) -> str:
    """'' when the cut reads right; otherwise what went wrong, in a few words."""
    full_mem = full.klass not in contract.NO_MEMORY_FAILURE
    mem = d.klass not in contract.NO_MEMORY_FAILURE
    if not full_mem:
        return "" if not mem else f"clean log's cut read as {d.klass}"
    if cut.has_root:
        if d.klass == full.klass:
            return ""
        if d.phase_basis_kind == "likely":       # nothing in the cut shows the phase, and the card says so
            return f"guess: {d.klass} (want {full.klass}), phase basis likely, confidence {d.confidence}"
        return f"{d.klass} (want {full.klass})"
    if d.klass in (full.klass, "cascade_only") or not mem:
        return ""
    return f"{d.klass} without the root line (want {full.klass}, cascade_only or no failure)"


def lossless_cuts(lines: list[str]) -> list[Cut]:
    """The renderings that drop nothing: quoted, indented, CRLF, hard-wrapped, fenced (for the field guide's
    renders, which are pastes already: whatever they read as, each rendering must read as too)."""
    wrapped = [t[j:j + WRAP] for t in lines for j in range(0, max(len(t), 1), WRAP)]
    return [Cut("markdown_quote", ["> " + t for t in lines], True), Cut("indented", ["    " + t for t in lines], True),
            Cut("crlf", [t + "\r" for t in lines], True), Cut(f"wrap{WRAP}", wrapped, True),
            Cut("fenced", ["```"] + lines + ["```"], True)]


def _row(group: str, cut: Cut, full, d) -> dict:
    return {"log": group, "cut": cut.name, "lines": len(cut.lines), "has_root": cut.has_root, "want": full.klass,
            "got": d.klass, "phase": d.phase, "want_phase": full.phase, "basis": d.phase_basis_kind,
            "miss": judge(full, d, cut)}


def run(log_root: Path, field_guide: bool = False) -> dict:
    rules = default_rules()
    rows = []
    for sub in LOG_DIRS:
        for path in sorted((log_root / sub).glob("*.log")):
            lines = engine_lines(path.read_text(encoding="utf-8", errors="replace"))
            full = diagnose(lines, path.name, rules)
            root = full.root.n - 1 if full.root is not None and full.klass not in contract.NO_MEMORY_FAILURE else None
            for cut in cuts_of(lines, root):
                rows.append(_row(f"{sub}/{path.stem}", cut, full, diagnose(cut.lines, f"{path.name}:{cut.name}", rules)))
    if field_guide:
        for path in sorted((log_root / "field-guide").glob("*.log")):
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            full = diagnose(lines, path.name, rules)
            for cut in lossless_cuts(lines):
                rows.append(_row(f"field-guide/{path.stem}", cut, full,
                                 diagnose(cut.lines, f"{path.name}:{cut.name}", rules)))
    missed = [r for r in rows if r["miss"] and not r["miss"].startswith("guess:")]
    return {"cuts": len(rows), "right": sum(1 for r in rows if not r["miss"]),
            "guessed": sum(1 for r in rows if r["miss"].startswith("guess:")), "missed": len(missed),
            "phase_kept": sum(1 for r in rows if r["has_root"] and r["phase"] == r["want_phase"]),
            "with_root": sum(1 for r in rows if r["has_root"]), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--show", metavar="LOG:CUT")
    ap.add_argument("--logs", type=Path, default=ROOT / "fixtures" / "logs")
    ap.add_argument("--field-guide", action="store_true",
                    help="also the lossless renderings (quoted, indented, CRLF, wrapped, fenced) of every field-guide fixture")
    a = ap.parse_args(argv)
    if a.show:
        log, _, name = a.show.partition(":")
        path = a.logs / f"{log}.log"
        lines = engine_lines(path.read_text(encoding="utf-8", errors="replace"))
        full = diagnose(lines, path.name, default_rules())
        root = full.root.n - 1 if full.root is not None and full.klass not in contract.NO_MEMORY_FAILURE else None
        for cut in cuts_of(lines, root):
            if cut.name == name:
                print("\n".join(cut.lines))
                return 0
        print(f"no cut {name!r} of {log}", file=sys.stderr)
        return 2
    res = run(a.logs, a.field_guide)
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    for r in res["rows"]:
        if r["miss"]:
            tag = "GUESS" if r["miss"].startswith("guess:") else "MISS "
            print(f"{tag} {r['log']:42} {r['cut']:16} {r['lines']:5} lines  {r['miss'].removeprefix('guess: ')}")
    print(f"\n{res['right']}/{res['cuts']} cuts read as their log; {res['guessed']} more guessed with confidence low "
          f"(nothing in the cut shows the phase: the card says so); {res['missed']} missed. Phase kept on "
          f"{res['phase_kept']}/{res['with_root']} cuts that hold the root line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
