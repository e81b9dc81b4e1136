"""Where oomdoctor finds its rules and writes its cards."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parent


def rules_dir() -> Path:
    """The rules folder: $OOMDOCTOR_RULES, else rules/ beside the package (source checkout / editable install)."""
    env = os.environ.get("OOMDOCTOR_RULES")
    return Path(env) if env else SOURCE_ROOT / "rules"


def default_incidents_dir() -> Path:
    env = os.environ.get("OOMDOCTOR_INCIDENTS")
    return Path(env) if env else Path.cwd() / "incidents"
