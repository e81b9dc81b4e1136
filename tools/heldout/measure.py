"""Measure oomdoctor on the held-out pastes of tools/heldout/manifest.yaml (issue 12).

Each paste is cut out of a local copy of its source (a git mirror of a public repository, or an unpacked
PyPI sdist), written to a temporary file, and diagnosed with ``diagnose_file(path, default_rules())``:
the same code path as ``oomdoctor diagnose LOG``. Nothing fetched is stored in this repository.

    python tools/heldout/measure.py                 # the table and the totals
    python tools/heldout/measure.py --json          # one JSON object
    python tools/heldout/measure.py --show ID       # print one extracted paste (no diagnosis)
    python tools/heldout/measure.py --extract-only  # check that every paste can be cut out
    python tools/heldout/measure.py --manifest tools/heldout/manifest2.yaml   # set 2 (README: "Set 2")

Sources: --mirrors DIR (or HELDOUT_MIRRORS; default /work/.mirror) holds OWNER+NAME/repo git dirs;
--sdists DIR (or HELDOUT_SDISTS; default /tmp/sdist) holds NAME-VERSION/ unpacked sdists. A paste whose
source is absent is skipped with a message, and counted as skipped, never as right or wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections import defaultdict
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.yaml"
# measure the oomdoctor of this checkout, not whichever one the environment has installed (an editable install of
# another worktree would otherwise be imported: the script's own folder, not the repository root, is on sys.path)
sys.path.insert(0, str(HERE.parents[1]))


class Absent(Exception):
    """The paste's source is not on this machine."""


# ----------------------------------------------------------------------------- extraction

ENGINE_SPELLINGS = {"llama.cpp": "llamacpp", "llama-cpp": "llamacpp", "TensorRT-LLM": "tensorrt_llm", "tensorrt-llm": "tensorrt_llm"}

def read_source(src: dict, entry_src: dict, mirrors: Path, sdists: Path) -> str:
    path = entry_src["path"] if isinstance(entry_src["path"], str) else "/".join(entry_src["path"])
    if src["kind"] == "git":
        owner, name = src["repo"].split("/")
        gitdir = mirrors / f"{owner}+{name}" / "repo"
        if not gitdir.exists():
            raise Absent(f"no mirror {gitdir} (fetch github:{src['repo']})")
        rev = entry_src.get("rev", src["commit"])
        out = subprocess.run(["git", "-C", str(gitdir), "show", f"{rev}:{path}"], capture_output=True)
        if out.returncode:
            raise Absent(f"{src['repo']}@{rev[:10]} has no {path}: {out.stderr.decode(errors='replace').strip()}")
        return out.stdout.decode("utf-8", errors="replace")
    root = sdists / f"{src['package']}-{src['version']}"
    if not (root / path).exists():
        raise Absent(f"no {root / path} (see README: pip download the {src['package']}=={src['version']} sdist)")
    return (root / path).read_text(encoding="utf-8", errors="replace")


def notebook_cell_output(text: str, cell: int, source: bool = False) -> str:
    """The stream output (stdout and stderr, in order) of one notebook cell: what the cell printed.
    With ``source``, the cell's own text instead (a markdown cell that quotes a log in a code block)."""
    nb = json.loads(text)
    if source:
        src = nb["cells"][cell].get("source", "")
        return "".join(src) if isinstance(src, list) else src
    parts = []
    for out in nb["cells"][cell].get("outputs", []) or []:
        if out.get("output_type") == "stream":
            t = out.get("text", "")
            parts.append("".join(t) if isinstance(t, list) else t)
    return "".join(parts)


CODE_SPAN = re.compile(r"``(.+?)``|`([^`]+)`")


def cut(text: str, spec: dict) -> str:
    if "cell" in spec:
        text = notebook_cell_output(text, spec["cell"], spec.get("cell_source", False))
    lines = text.split("\n")
    if "lines" in spec:
        a, b = spec["lines"]
        lines = lines[a - 1:b]
    out = "\n".join(lines)
    if spec.get("heading"):
        out = re.sub(r"^#+\s*", "", out)
    if "inline" in spec:
        spans = [m.group(1) or m.group(2) for m in CODE_SPAN.finditer(out)]
        out = spans[spec["inline"] - 1]
    if spec.get("unescape_md"):
        out = re.sub(r"\\([\[\]\\`*_{}()#+\-.!])", r"\1", out)
    if spec.get("dedent"):
        out = textwrap.dedent(out)
    if "strip_prefix" in spec:
        p = spec["strip_prefix"]
        out = "\n".join(l[len(p):] if l.startswith(p) else l for l in out.split("\n"))
    return out.rstrip("\n") + "\n"


def extract(entry: dict, sources: dict, mirrors: Path, sdists: Path) -> str:
    spec = entry["source"]
    return cut(read_source(sources[spec["from"]], spec, mirrors, sdists), spec)


# ----------------------------------------------------------------------------- scoring
def oom_classes() -> set[str]:
    from oomdoctor import contract
    return {k for k, v in contract.CLASSES.items() if v["type"] == "cuda_oom"}


def accepted(names: list[str], ooms: set[str]) -> set[str]:
    out: set[str] = set()
    for n in names:
        # the contract's name of a clean log's class is `unknown` (exit 3): an acceptable `clean` is that
        out |= ooms if n == "any_oom" else {"unknown"} if n == "clean" else {n}
    return out


def score(entry: dict, got: dict, ooms: set[str]) -> dict:
    from oomdoctor import contract
    exp = entry["expected"]
    want = exp["class"]
    if want == "clean":
        strict = got["class"] == "unknown"          # the contract: a clean log is `unknown`, exit 3
    else:
        strict = got["class"] in accepted([want], ooms)
    lenient = strict or got["class"] in accepted(entry.get("acceptable", []), ooms)
    phase_scored = want != "any_oom"
    phase_ok = strict and (want == "clean" or got["phase"] == exp["phase"]) if phase_scored else None
    # a label's spelling of an engine's name is its id (set 12's pickers wrote "llama.cpp" for llamacpp)
    engines = {ENGINE_SPELLINGS.get(e, e) for e in (entry["engine"], *entry.get("engine_alt", []))}
    if not entry.get("engine_in_paste", True) or entry["engine"] is None:
        engines.add(None)
    return {"class_ok": strict, "lenient_ok": lenient, "phase_ok": phase_ok,
            "engine_ok": got["engine"] in engines,
            "memory_failure": got["class"] in contract.CLASSES and got["class"] not in contract.NO_MEMORY_FAILURE,
            "oom": got["class"] in ooms, "refused": got["class"].startswith("error:")}


def diagnose(text: str, ruleset) -> dict:
    from oomdoctor.diagnose.classify import diagnose_file
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False, encoding="utf-8") as f:
        f.write(text)
        path = f.name
    try:
        d = diagnose_file(path, ruleset)
        return {"class": d.klass, "phase": d.phase, "engine": d.engine, "rule": d.rule,
                "basis": d.phase_basis_kind, "confidence": d.confidence}
    except Exception as e:  # a crash is a result too: it is counted wrong
        return {"class": f"error:{type(e).__name__}", "phase": "none", "engine": None, "rule": None,
                "basis": "", "confidence": "", "error": str(e)[:200]}
    finally:
        os.unlink(path)


# ----------------------------------------------------------------------------- report
def pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100.0 * n / d:.1f}%)" if d else "0/0"


def totals(rows: list[dict]) -> dict:
    def agg(rs: list[dict]) -> dict:
        ph = [r for r in rs if r["phase_ok"] is not None]
        clean = [r for r in rs if r["expected"]["class"] == "clean"]
        return {"n": len(rs), "class": sum(r["class_ok"] for r in rs), "lenient": sum(r["lenient_ok"] for r in rs),
                "class_phase": sum(bool(r["phase_ok"]) for r in ph), "class_phase_n": len(ph),
                "engine": sum(r["engine_ok"] for r in rs), "clean_n": len(clean),
                "clean_called_memory_failure": sum(r["memory_failure"] for r in clean),
                "clean_called_oom": sum(r["oom"] for r in clean),
                "refused": sum(r["refused"] for r in rs)}
    by_engine, by_class = defaultdict(list), defaultdict(list)
    for r in rows:
        by_engine[str(r["engine"])].append(r)
        by_class[r["expected"]["class"]].append(r)
    no_overlap = [r for r in rows if not r.get("overlap")]
    return {"all": agg(rows), "without_overlap": agg(no_overlap),
            "by_engine": {k: agg(v) for k, v in sorted(by_engine.items())},
            "by_class": {k: agg(v) for k, v in sorted(by_class.items())}}


def mark(b) -> str:
    return "-" if b is None else ("ok" if b else "WRONG")


def print_table(rows: list[dict], skipped: list[dict], tot: dict) -> None:
    print(f"{'id':36} {'engine':12} {'expected':34} {'got':40} {'class':5} {'len.':5} {'phase':5} {'eng.':5}")
    for r in rows:
        e, g = r["expected"], r["got"]
        print(f"{r['id']:36} {str(r['engine']):12} {e['class'] + '/' + e['phase']:34} "
              f"{g['class'] + '/' + g['phase'] + ' (' + str(g['engine']) + ')':40} "
              f"{mark(r['class_ok']):5} {mark(r['lenient_ok']):5} {mark(r['phase_ok']):5} {mark(r['engine_ok']):5}")
    for s in skipped:
        print(f"{s['id']:36} SKIPPED: {s['reason']}")
    print()
    for title, t in (("all", tot["all"]), ("without field-guide wording overlap", tot["without_overlap"])):
        print(f"{title}: n={t['n']}  class {pct(t['class'], t['n'])}  lenient {pct(t['lenient'], t['n'])}  "
              f"class+phase {pct(t['class_phase'], t['class_phase_n'])}  engine {pct(t['engine'], t['n'])}  "
              f"clean called a memory failure {t['clean_called_memory_failure']}/{t['clean_n']} "
              f"(an OOM class {t['clean_called_oom']})  refused (diagnose raised) {t['refused']}")
    for key in ("by_engine", "by_class"):
        print(f"\n{key}:")
        for k, t in tot[key].items():
            print(f"  {k:22} n={t['n']:3}  class {pct(t['class'], t['n']):16} lenient {pct(t['lenient'], t['n']):16} "
                  f"class+phase {pct(t['class_phase'], t['class_phase_n']):16} engine {pct(t['engine'], t['n'])}")
    if skipped:
        print(f"\nskipped: {len(skipped)} (source absent)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", type=Path, default=MANIFEST)
    ap.add_argument("--mirrors", type=Path, default=Path(os.environ.get("HELDOUT_MIRRORS", "/work/.mirror")))
    ap.add_argument("--sdists", type=Path, default=Path(os.environ.get("HELDOUT_SDISTS", "/tmp/sdist")))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--show", metavar="ID")
    ap.add_argument("--extract-only", action="store_true")
    ap.add_argument("--only", nargs="*", metavar="ID")
    a = ap.parse_args(argv)
    m = yaml.safe_load(a.manifest.read_text())
    pastes = [p for p in m["pastes"] if not a.only or p["id"] in a.only]
    if a.show:
        (entry,) = [p for p in m["pastes"] if p["id"] == a.show]
        sys.stdout.write(extract(entry, m["sources"], a.mirrors, a.sdists))
        return 0
    ruleset = None
    if not a.extract_only:
        from oomdoctor.diagnose.rules import default_rules
        ruleset, ooms = default_rules(), oom_classes()
    rows, skipped = [], []
    for p in pastes:
        try:
            text = extract(p, m["sources"], a.mirrors, a.sdists)
        except Absent as e:
            print(f"skip {p['id']}: {e}", file=sys.stderr)
            skipped.append({"id": p["id"], "reason": str(e)})
            continue
        if a.extract_only:
            print(f"{p['id']:36} {len(text.splitlines()):4} lines  {text.splitlines()[0][:70]!r}")
            continue
        got = diagnose(text, ruleset)
        rows.append({"id": p["id"], "engine": p["engine"], "expected": p["expected"], "got": got,
                     "overlap": p.get("overlap"), "lines": len(text.splitlines()), **score(p, got, ooms)})
    if a.extract_only:
        return 1 if skipped else 0
    tot = totals(rows)
    if a.json:
        print(json.dumps({"results": rows, "skipped": skipped, "totals": tot}, indent=1))
    else:
        print_table(rows, skipped, tot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
