"""A user of the package has only the project: no file of it may send the reader to a path outside it
(the sibling folder of shared material the project was started from, or the machine it was written on)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist", ".gpu", ".whl"}
# a relative path that climbs out to shared/, or the absolute folder it lives in on the build machine
OUTSIDE = re.compile(r"\.\./shar[e]d\b|/work/shar[e]d\b")   # [e]: this line does not match itself
DOCS_NAMED = ("docs/contract.md", "docs/incidents.md", "docs/vllm-messages.md")


def _text_files() -> list[Path]:
    out = []
    for p in ROOT.rglob("*"):
        if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(ROOT).parts) and p.suffix not in (".pickle", ".gz", ".png"):
            out.append(p)
    return out


def test_no_project_file_names_a_path_outside_the_project() -> None:
    hits = []
    for p in _text_files():
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_the_documents_the_project_cites_are_in_it() -> None:
    for rel in DOCS_NAMED:
        assert (ROOT / rel).is_file(), rel
    cited = set()
    for p in _text_files():
        if p.parent.name == "heldout" and p.name.startswith("manifest"):
            continue        # the held-out sets point into other repositories (their own docs/*.md)
        if p.suffix in (".md", ".py", ".yaml", ".sh"):
            cited.update(re.findall(r"docs/[a-z_-]+\.md", p.read_text(errors="replace")))
    missing = sorted(c for c in cited if not (ROOT / c).is_file())
    assert not missing, missing
