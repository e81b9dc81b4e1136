"""Shared test helpers: where the real fixture logs are, and running the CLI in-process."""
from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200"


@dataclass
class CliResult:
    rc: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)

    @property
    def err_lines(self) -> list[str]:
        return self.err.splitlines()


def invoke(*args, env: dict | None = None) -> CliResult:
    """``oomdoctor ARGS`` in this process (``oomdoctor.cli.main``), its exit code and output.
    Safe inside hypothesis tests: it uses no pytest fixture."""
    from oomdoctor.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
                rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return CliResult(rc, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def cli(tmp_path_factory):
    """``cli("diagnose", log, "--json", ...)`` → CliResult; cards without --out go to a temp dir."""
    incidents = str(tmp_path_factory.mktemp("incidents"))

    def run(*args) -> CliResult:
        return invoke(*args, env={"OOMDOCTOR_INCIDENTS": incidents})

    return run


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


def assert_reads_as(got, want) -> None:
    """A real log as a collector handed it back (journald, Docker's json-file) is diagnosed as the log itself: engine,
    version, class, phase, rule, the kind of phase evidence, the root line's message and process, numbers, levers."""
    assert (got.engine, got.engine_version, got.klass, got.phase, got.rule, got.phase_basis_kind) == \
        (want.engine, want.engine_version, want.klass, want.phase, want.rule, want.phase_basis_kind)
    if want.root:
        assert (got.root.line.msg, got.root.line.process) == (want.root.line.msg, want.root.line.process)
    else:
        assert got.root is None
    assert got.numbers == want.numbers and got.levers == want.levers


def h200_engine_lines(name: str) -> list[str]:
    """A real H200 log's lines (fixtures/logs/vllm-0.25.1-h200/NAME.log) without the capture harness's `# ` header."""
    return [ln for ln in (FIXTURES / f"{name}.log").read_text(encoding="utf-8").splitlines() if not ln.startswith("# ")]


def assert_render_reads_as(tmp_path: Path, name: str, render, rules):
    """A real H200 log rendered by ``render`` (lines → lines: a collector's or a terminal's form of it) is diagnosed
    as the log itself (assert_reads_as); returns (the render's diagnosis, the log's)."""
    from oomdoctor.diagnose.classify import diagnose_file

    lines = h200_engine_lines(name)
    rendered, plain = tmp_path / f"{name}.rendered.log", tmp_path / f"{name}.log"
    rendered.write_text("\n".join(render(lines)) + "\n", encoding="utf-8")
    plain.write_text("\n".join(lines) + "\n", encoding="utf-8")
    got, want = diagnose_file(rendered, rules), diagnose_file(plain, rules)
    assert_reads_as(got, want)
    return got, want

