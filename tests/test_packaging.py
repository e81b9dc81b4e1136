"""Publish-ready packaging: one version, a licence, the data files a normal (non-editable) install needs, the
console script, and a README whose first command installs without -e."""
from __future__ import annotations

import fnmatch
import importlib
import re
import tomllib
from pathlib import Path

import oomdoctor

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def test_the_version_comes_from_one_place() -> None:
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "oomdoctor.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", oomdoctor.__version__)
    hard_coded = [str(p.relative_to(ROOT)) for p in (ROOT / "oomdoctor").rglob("*.py")
                  if p.name != "__init__.py" and re.search(r"""["']0\.1\.0["']""", p.read_text())]
    assert not hard_coded


def test_licence_and_classifiers() -> None:
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]   # SPDX expression instead
    assert "Programming Language :: Python :: 3.11" in PROJECT["classifiers"]
    assert PROJECT["requires-python"] == ">=3.11"
    assert (ROOT / "oomdoctor" / "py.typed").is_file()


def test_every_data_file_of_the_package_is_installed() -> None:
    """A normal install carries only .py files and package-data: a rule, schema or levers file left out works
    in the clone (editable) and is missing for `pip install .` / `pipx install .`."""
    globs = PYPROJECT["tool"]["setuptools"]["package-data"]["oomdoctor"]
    pkg = ROOT / "oomdoctor"
    data = [p.relative_to(pkg).as_posix() for p in pkg.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert data, "the package has data files (rules, schemas)"
    missing = [d for d in data if not any(fnmatch.fnmatchcase(d, g) for g in globs)]
    assert not missing, missing


def test_the_console_script_and_the_plugin_entry_point_resolve() -> None:
    for spec in (PROJECT["scripts"]["oomdoctor"], PROJECT["entry-points"]["vllm.general_plugins"]["oomdoctor"]):
        mod, _, attr = spec.partition(":")
        assert callable(getattr(importlib.import_module(mod), attr)), spec


def test_optional_extras_are_declared() -> None:
    extras = PROJECT["optional-dependencies"]
    assert {"test", "plot"} <= set(extras)
    assert any(d.startswith("matplotlib") for d in extras["plot"])
    assert any(d.startswith("jsonschema") for d in extras["test"])


def test_the_readme_starts_with_the_two_commands_and_installs_without_e() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    first, second = blocks[0].strip(), blocks[1].strip()
    assert text.index("```bash") < 20
    assert "pip install '.[test]'" in first and " -e " not in first and "--editable" not in first
    assert "oomdoctor diagnose fixtures/logs/vllm-0.25.1-h200/A_fail.log" in first
    assert (ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200" / "A_fail.log").is_file()
    assert second.endswith("python -m pytest -q")
    assert '-m "not slow"' in text
