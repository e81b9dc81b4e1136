"""Secrets never reach a card, a log copy or the terminal: tokens and keys in env, argv and text."""
from __future__ import annotations

import re
from typing import Any

MASK = "***REDACTED***"
SECRET_KEY_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH|COOKIE|SESSION)", re.I)
SECRET_FLAGS = ("--api-key", "--hf-token", "--token", "--password", "--secret", "--access-key", "--ssl-keyfile-password")
TOKEN_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{20,}\b"),                       # Hugging Face
    re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_\-]{20,}\b"),            # OpenAI-style
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"),                  # GitHub
    re.compile(r"\bxox[baprs]-[A-Za-z0-9\-]{10,}\b"),               # Slack
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),                            # AWS access key id
    re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._\-]{16,}"),
    re.compile(r"(?i)((?:api[_-]?key|token|secret|password)['\"]?\s*[=:]\s*['\"]?)[^\s'\",}]{6,}"),
]


def redact_text(s: str) -> str:
    for rx in TOKEN_PATTERNS:
        if rx.groups:
            s = rx.sub(lambda m: m.group(1) + ("" if m.group(1).endswith((" ", "=", ":", "'", '"')) else " ") + MASK, s)
        else:
            s = rx.sub(MASK, s)
    return s


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if SECRET_KEY_RE.search(k) and v else redact_text(str(v))) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    out: list[str] = []
    mask_next = False
    for a in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        flag = a.split("=", 1)[0]
        if flag in SECRET_FLAGS or (flag.startswith("--") and SECRET_KEY_RE.search(flag.replace("-", "_"))
                                    and not flag.startswith("--kv-")):
            if "=" in a:
                out.append(f"{flag}={MASK}")
            else:
                out.append(a)
                mask_next = True
            continue
        out.append(redact_text(a))
    return out


def redact_obj(obj: Any, _key: str = "") -> Any:
    """Deep copy of ``obj`` with secrets masked: env-like keys by name, every string by pattern."""
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            ks = str(k)
            if isinstance(v, str) and SECRET_KEY_RE.search(ks) and v and not ks.endswith(("_bytes", "_tokens")):
                out[k] = MASK
            elif ks == "argv" and isinstance(v, list):
                out[k] = redact_argv([str(x) for x in v])
            else:
                out[k] = redact_obj(v, ks)
        return out
    if isinstance(obj, list):
        return [redact_obj(v, _key) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
