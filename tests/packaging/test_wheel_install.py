"""A normal (non-editable) install works: the wheel carries the rules and schemas, and `oomdoctor diagnose`
classifies a bundled example log from a fresh virtual environment, far from the source checkout."""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fixtures" / "logs" / "vllm-0.25.1-h200" / "A_fail.log"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                        str(ROOT)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = out.glob("oomdoctor-*.whl")
    return whl


def test_the_wheel_carries_rules_and_schemas(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "oomdoctor/card/schemas/incident-card.schema.json" in names
    for engine in ("vllm", "sglang", "llamacpp"):
        assert f"oomdoctor/engines/{engine}/rules/engine.yaml" in names, engine
    assert sum(n.endswith(".yaml") and "/rules/" in n for n in names) >= 20


@pytest.mark.slow
def test_diagnose_from_a_fresh_venv_non_editable(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    # then the dependencies come from this interpreter's site-packages, as plain paths after the venv's own (written
    # after the install, so that pip does not take an oomdoctor there for already installed; a .pth line only adds
    # a folder and runs no other .pth file, so an editable oomdoctor there is not imported either)
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OOMDOCTOR_", "PYTHONPATH"))}
    where = subprocess.run([str(py), "-c", "import oomdoctor; print(oomdoctor.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, env=env, check=True).stdout.strip()
    assert where.startswith(str(env_dir)), f"oomdoctor imported from {where}, not from the fresh venv"
    r = subprocess.run([str(env_dir / "bin" / "oomdoctor"), "diagnose", str(EXAMPLE), "--json", "--no-card",
                        "--no-device"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["classification"]["class"] == "kv_capacity"
