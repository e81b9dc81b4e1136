"""The CI gate: no serving-config change lands without a passing retest of its exact effective config.

Pipeline (plain functions, each testable alone):

1. :mod:`.project` reads the project file (``.oomdoctor.yaml``): which files are serving configs, what kind
   each is, and what it runs (engine, engine version in use, model, revision, target devices).
2. :mod:`.git` finds what changed against the base: ``git diff --name-status -M <merge-base>`` (committed,
   staged and unstaged changes of tracked files) plus untracked files, with renames.
3. :mod:`.configs` parses each config (vLLM ``--config`` YAML, serving-profiles file via
   :mod:`oomdoctor.profiles.reader`, serve script via :mod:`.script` and :mod:`.shellwords`, env file) into
   :class:`ServingConfig` objects, one per profile, fingerprinted with :mod:`oomdoctor.card.fingerprint`.
4. :mod:`.verdict` looks the fingerprint up in the receipts and incident cards (:mod:`oomdoctor.card.receipt`);
   :mod:`.run` drives it all (:func:`run_gate`), :mod:`.render` prints it.

``load_serving_config(path, profile)`` (:mod:`.lookup`) is the entry point for ``oomdoctor record --serving-config``.
"""
from __future__ import annotations

from oomdoctor.engines.vllm.argv import normalize_args, parse_serve_args
from oomdoctor.gate.configs import Profile, ServingConfig, build_serving_configs, parse_profiles, parse_vllm_yaml
from oomdoctor.gate.git import Git, GitTree, Tree, WorkTree
from oomdoctor.gate.lookup import list_serving_configs, load_serving_config
from oomdoctor.gate.project import PROJECT_FILE, ConfigEntry, Project, load_project, parse_project
from oomdoctor.gate.render import render_text
from oomdoctor.gate.run import run_gate
from oomdoctor.gate.script import ServeCommand, parse_env_file, parse_serve_script
from oomdoctor.gate.verdict import ConfigResult, GateResult, record_command, verdict

__all__ = ["PROJECT_FILE", "ConfigEntry", "ConfigResult", "GateResult", "Git", "GitTree", "Profile", "Project",
           "ServeCommand", "ServingConfig", "Tree", "WorkTree", "build_serving_configs", "list_serving_configs",
           "load_project", "load_serving_config", "normalize_args", "parse_env_file", "parse_profiles",
           "parse_project", "parse_serve_args", "parse_serve_script", "parse_vllm_yaml", "record_command",
           "render_text", "run_gate", "verdict"]
