"""A lever's change written in the engine's own language: the flag, keyword argument or environment variable
the user pastes. The words are data (``oomdoctor/engines/<engine>/levers.yaml``); this module only fills them in.

``flag_for("vllm", "max_model_len", 1998848, "vllm-serve")`` → ``--max-model-len 1998848``;
with launcher ``vllm-llm`` (the offline ``LLM(...)`` API) → ``max_model_len=1998848``.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from oomdoctor import safeyaml
from oomdoctor.paths import ENGINES_DIR

OFFLINE_LAUNCHERS = frozenset({"vllm-llm", "offline", "python"})


@lru_cache(maxsize=16)
def lever_table(engine: str) -> dict[str, Any]:
    """``engines/<engine>/levers.yaml`` as read: the ONE reader of that file ({} when the engine has none)."""
    path = ENGINES_DIR / engine / "levers.yaml"
    if not engine or "/" in engine or not path.is_file():
        return {}
    doc = safeyaml.load(path.read_text(encoding="utf-8")) or {}
    return doc if isinstance(doc, dict) else {}


@lru_cache(maxsize=16)
def engine_words(engine: str) -> dict[str, dict[str, Any]]:
    """The ``settings`` table of ``engines/<engine>/levers.yaml`` ({} when the engine has none)."""
    table = lever_table(engine).get("settings")
    return {str(k): dict(v) for k, v in (table or {}).items() if isinstance(v, dict)}


def _style(words: dict[str, Any], launcher: str | None) -> str | None:
    if "env" in words and len(words) == 1 + ("bool" in words):
        return "env"
    offline = (launcher or "") in OFFLINE_LAUNCHERS
    for style in (("offline", "serve") if offline else ("serve", "offline")) + ("env",):
        if style in words:
            return style
    return None


def flag_for(engine: str, setting: str, value: Any, launcher: str | None = None) -> str | None:
    """The text that sets ``setting`` to ``value`` for ``engine`` started by ``launcher``, or None when the
    engine's table does not know the setting."""
    words = engine_words(engine).get(setting)
    if not words:
        return None
    style = _style(words, launcher)
    if style is None:
        return None
    template = str(words[style])
    if words.get("bool") and style != "env":
        if value in (False, "false", "False", 0):
            neg = words.get(f"{style}_false")
            return str(neg) if neg else None
        return template
    return template.format(value=value)


def flags_for_change(engine: str, change: dict[str, Any], launcher: str | None = None) -> list[str]:
    """Every setting of a lever's ``change`` in the engine's words; settings the table lacks are left out."""
    out = []
    for k, v in change.items():
        f = flag_for(engine, k, v, launcher)
        if f:
            out.append(f)
    return out
