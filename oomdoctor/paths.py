"""Where oomdoctor finds its rules, its fixtures and writes its cards."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parent
ENGINES_DIR = PACKAGE_DIR / "engines"


def rules_dir() -> Path:
    """The rules root: $OOMDOCTOR_RULES, else the package's own ``engines/`` folder, whose ``<engine>/rules/``
    folders hold each engine's ``engine.yaml`` and rule files (package data, so a wheel carries them)."""
    env = os.environ.get("OOMDOCTOR_RULES")
    return Path(env) if env else ENGINES_DIR


def fixtures_dir() -> Path:
    """The fixture logs that rule test cases name: $OOMDOCTOR_FIXTURES, else ``fixtures/logs`` of the source
    checkout, else ``fixtures/logs`` under the current directory."""
    env = os.environ.get("OOMDOCTOR_FIXTURES")
    if env:
        return Path(env)
    here = SOURCE_ROOT / "fixtures" / "logs"
    return here if here.is_dir() else Path.cwd() / "fixtures" / "logs"


def default_incidents_dir() -> Path:
    env = os.environ.get("OOMDOCTOR_INCIDENTS")
    return Path(env) if env else Path.cwd() / "incidents"
