"""THE redaction: secrets never reach a card, a ``.runs/`` log copy, a receipt, stdout or ``--json``.

Every output path calls this module (cards and receipts through :func:`redact_obj`, teed engine logs and the
terminal through :func:`redact_text`), so what counts as a secret is decided here only:

- URL credentials (``scheme://user:PASSWORD@host``);
- flags named like a secret, ``--flag VALUE``, ``--flag=VALUE`` and ``'--flag', 'VALUE'`` (argv reprs):
  ``--api-key``, ``--token``, ``--hf-token``, ``--password``, ``--ssl-keyfile-password`` ...;
- ``Authorization:`` headers (``Bearer``/``Basic``/any scheme) and bare ``Bearer`` tokens;
- ``NAME=value`` / ``NAME: value`` / ``'name': 'value'`` / ``"name": [..]`` where NAME looks like a key
  (a word of it is token, secret*, password, key, api_key, credential, auth, cookie ...: ``HF_TOKEN``,
  ``aws_secret_access_key``, ``OPENAI_API_KEY``, vLLM's ``'api_key': ['k1', 'k2']``);
- cloud key formats anywhere: ``hf_…``, ``sk-…``, ``ghp_…``/``github_pat_…``, ``xox?-…``, ``AKIA…``/``ASIA…``,
  ``AIza…``, JWTs.

A number is never a secret: ``KV per token = 244 GiB``, ``max_num_batched_tokens=16384`` and
``--max-num-batched-tokens 8192`` stay as they are (a word of the name must BE ``token``; ``tokens`` is not, and a
value that is a number, with or without a unit, is kept whatever its name). Every pattern here is linear-time: each
one starts only at the beginning of a word and its repeats are bounded or over disjoint classes.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

MASK = "***REDACTED***"

_SECRET_WORDS = frozenset({
    "token", "password", "passwd", "pwd", "passphrase", "key", "apikey", "accesskey", "secretkey", "privatekey",
    "credential", "credentials", "creds", "auth", "authorization", "cookie", "bearer",
})
# a name whose last word is one of these names a thing about a key, not the key: KeyError, key_file, token_budget ...
_NOT_A_SECRET_TAIL = frozenset({"error", "exception", "warning", "file", "path", "dir", "size", "len", "length",
                                "count", "type", "dtype", "bytes", "tokens", "budget", "name", "names", "id", "ids"})
# values that are no secret whatever their key's name (and an auth scheme is kept before its masked credentials)
_KEPT_VALUES = frozenset({"", MASK, "None", "null", "true", "false", "True", "False", "Bearer", "Basic", "bearer",
                          "basic", "Token", "Digest", "VALUE"})     # VALUE: a placeholder ("KEY=VALUE line")
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")        # snake, kebab, dotted, camelCase and CAPS words
_NUMBER = re.compile(r"[-+]?(?:\d[\d,_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?\s?(?:[KMGTPE]i?B|[KMGTPE]i?|B|%|x|s|ms"
                     r"|bytes|tokens?)?")

_URL_CRED = re.compile(r"(?<![A-Za-z0-9+.\-])([A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s/:@'\"]{0,256}:)[^\s/@'\"]{1,512}@")
_AUTH_HEADER = re.compile(r"(?i)(?<![\w-])(authorization['\"]?\s{0,8}[:=]\s{0,8}['\"]?)(?:(bearer|basic|token|digest|"
                          r"negotiate)\s{1,8})?[^\s'\",;}]{1,4096}")
_BEARER = re.compile(r"(?i)(?<![\w-])(bearer\s{1,8})[A-Za-z0-9._~+/=\-]{8,4096}")
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_\-]{0,63})(=|['\"]?,\s{0,4}['\"]|\s{1,8})"
                   r"([^\s'\",}\]]{1,4096})")
# a key and its separator. The value after a secret key (a quoted string, a [list] or a bare word; the closing
# quote/bracket is optional so that a value ALWAYS matches) is masked and consumed; the value of any other key is
# scanned on like the rest of the line, so that what it holds is looked at too ("env: [HF_TOKEN=...]",
# "msg: 'password=...'"). Each character is scanned once (linear on any line).
_KEY = re.compile(r"(?<![\w\-.])(['\"]?)([A-Za-z_][A-Za-z0-9_.\-]{0,127})\1(\s{0,8}[:=]\s{0,8})")
_VALUE = re.compile(r"'[^'\n]{0,4096}'?|\"[^\"\n]{0,4096}\"?|\[[^\]\n]{0,8192}\]?|[^\s,;}\]'\"]{1,4096}")
# every secret name of _SECRET_WORDS holds one of these (case-insensitive): no hint, no name to look at
_HINTS = ("secret", "pass", "pwd", "key", "cred", "auth", "cookie", "bearer")
_TOKEN_WORD = re.compile(r"token(?!s)")
_QUOTED = re.compile(r"'[^'\n]{0,4096}'|\"[^\"\n]{0,4096}\"")
TOKEN_PATTERNS = [
    re.compile(r"\bhf_[A-Za-z0-9]{20,4096}"),                          # Hugging Face
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_\-]{20,4096}"),         # OpenAI / Anthropic style
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,4096}|\bgithub_pat_[A-Za-z0-9_]{20,4096}"),   # GitHub
    re.compile(r"\bxox[baprs]-[A-Za-z0-9\-]{10,4096}"),                 # Slack
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),                       # AWS access key id
    re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"),                            # Google API key
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,4096}\.eyJ[A-Za-z0-9_\-]{8,4096}\.[A-Za-z0-9_\-]{8,4096}"),   # JWT
]
# the literal each of them starts with: a pattern runs only over a text that holds one (a plain `in`, C speed)
_TOKEN_HINTS = [("hf_",), ("sk-",), ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"), ("xox",), ("AKIA", "ASIA"), ("AIza",), ("eyJ",)]


def is_number(v: str) -> bool:
    """A number, with or without thousands separators and a unit: never redacted."""
    return bool(_NUMBER.fullmatch(v.strip().strip("'\"")))


@lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """Does a variable / key / flag name say it holds a secret? (``HF_TOKEN`` yes, ``max_num_batched_tokens`` no)"""
    words = [w.lower() for w in _WORD.findall(name)]
    if not words or words[-1] in _NOT_A_SECRET_TAIL:
        return False
    if any(w in _SECRET_WORDS or w.startswith("secret") for w in words):
        return True
    return any(a + b in _SECRET_WORDS for a, b in zip(words, words[1:]))      # api_key, access-key, private.key


def _mask_value(v: str) -> str:
    """``v`` masked keeping its shape: quotes, and a list's brackets and element count."""
    if is_number(v) or v.strip("'\"") in _KEPT_VALUES:
        return v
    if v.startswith("["):
        return _QUOTED.sub(lambda m: m.group(0) if is_number(m.group(0)) else m.group(0)[0] + MASK + m.group(0)[0], v)
    if v[:1] in "'\"" and v[-1:] == v[:1] and len(v) >= 2:
        return v[0] + MASK + v[0]
    return MASK


def _sub_flag(m: re.Match[str]) -> str:
    flag, sep, val = m.group(1), m.group(2), m.group(3)
    if not secret_name(flag) or is_number(val):
        return m.group(0)
    return f"{flag}{sep}{MASK}"


def _sub_auth(m: re.Match[str]) -> str:
    value = m.group(0)[m.end(2) - m.start(0) if m.group(2) else m.end(1) - m.start(0):].strip()
    if is_number(value) or value == MASK:
        return m.group(0)
    return m.group(1) + (m.group(2) + " " if m.group(2) else "") + MASK


def _redact_pairs(s: str) -> str:
    out, pos = [], 0
    while (m := _KEY.search(s, pos)) is not None:
        quote, key, sep = m.group(1), m.group(2), m.group(3)
        # "KV bytes per token = needed / max_model_len": a word of a sentence, not an assignment
        prose = not quote and key.islower() and key.isalpha() and sep[:1].isspace()
        v = _VALUE.match(s, m.end()) if secret_name(key) and not prose else None
        out.append(s[pos:m.end()] + (_mask_value(v.group(0)) if v else ""))
        pos = v.end() if v else m.end()
    out.append(s[pos:])
    return "".join(out)


def redact_text(s: str) -> str:
    if not s:
        return s
    if "://" in s and "@" in s:
        s = _URL_CRED.sub(lambda m: m.group(1) + MASK + "@", s)
    low = s.lower()
    if any(h in low for h in _HINTS) or ("token" in low and _TOKEN_WORD.search(low)):   # most lines name no secret
        s = _AUTH_HEADER.sub(_sub_auth, s)
        s = _BEARER.sub(lambda m: m.group(1) + MASK, s)
        s = _FLAG.sub(_sub_flag, s)
        s = _redact_pairs(s)
    for rx, hints in zip(TOKEN_PATTERNS, _TOKEN_HINTS):
        if any(h in s for h in hints):
            s = rx.sub(MASK, s)
    return s


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (_mask_value(str(v)) if secret_name(k) and v else redact_text(str(v))) for k, v in env.items()}


def redact_argv(argv: list[str]) -> list[str]:
    out: list[str] = []
    mask_next = False
    for a in argv:
        if mask_next:
            mask_next = False
            if not a.startswith("-") and not is_number(a):
                out.append(MASK)
                continue
        flag = a.split("=", 1)[0]
        if flag.startswith("-") and secret_name(flag):
            if "=" in a:
                out.append(f"{flag}={_mask_value(a.split('=', 1)[1])}")
            else:
                out.append(a)
                mask_next = True
            continue
        out.append(redact_text(a))
    return out


def redact_obj(obj: Any, _key: str = "") -> Any:
    """Deep copy of ``obj`` with secrets masked: values of secret-named keys, argv lists by flag, every string by
    pattern. Numbers (ints, floats, and strings that are numbers) are never masked."""
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for k, v in obj.items():
            ks = str(k)
            if ks == "argv" and isinstance(v, list):
                out[k] = redact_argv([str(x) for x in v])
            elif secret_name(ks) and isinstance(v, str) and v:
                out[k] = _mask_value(v)
            elif secret_name(ks) and isinstance(v, list):
                out[k] = [_mask_value(x) if isinstance(x, str) and x else redact_obj(x, ks) for x in v]
            else:
                out[k] = redact_obj(v, ks)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v, _key) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj
