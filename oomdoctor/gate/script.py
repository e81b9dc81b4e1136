"""Serve scripts and env files: the one ``vllm serve`` command a script starts, with its environment."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from oomdoctor.card import fingerprint as fpmod
from oomdoctor.engines.vllm.argv import find_serve, normalize_args, parse_serve_args
from oomdoctor.errors import BadInput
from oomdoctor.gate.shellwords import _ARGS_SENTINEL, _ASSIGN_RE, _NAME, _Unresolvable, _expand, _split_commands

# the value is stripped after the match: a lazy (.*?)\s*$ rescanned every run of blanks from each of its spaces
_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s?(.*)$")
_COMMENT = re.compile(r"\s#")


def parse_env_file(text: str, origin: str) -> dict[str, str]:
    """KEY=VALUE lines (``export`` allowed, ``#`` comments, values in quotes or bare)."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = _ENV_LINE.match(line)
        if not m:
            raise BadInput(f"{origin}:{n}: not a KEY=VALUE line: {s[:80]!r}")
        val = m.group(2).strip()
        if val[:1] in ("'", '"'):
            try:
                toks = shlex.split(val, comments=True)
            except ValueError as e:
                raise BadInput(f"{origin}:{n}: {e} in the value of {m.group(1)}")
            if len(toks) != 1:
                raise BadInput(f"{origin}:{n}: the value of {m.group(1)} is not one quoted string")
            val = toks[0]
        else:
            c = _COMMENT.search(val)            # a comment starts at the blanks before the first " #"
            val = val[:c.start()].rstrip() if c else val
        out[m.group(1)] = val
    return out


@dataclass
class ServeCommand:
    line: int
    model: str | None
    revision: str | None
    args: dict[str, Any]
    env: dict[str, str]
    config_files: list[str]
    argv: list[str]
    notes: list[str] = field(default_factory=list)


@dataclass
class _ScriptState:
    """What the script has set so far, in order: variables, which are exported, ``set -a``, serve commands."""

    vars_: dict[str, str]
    exported: set[str]
    hint: str
    allexport: bool = False
    found: list[ServeCommand] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _set_options(st: _ScriptState, rtoks: list[str]) -> None:
    for t in rtoks[1:]:
        if t.startswith("-") and "a" in t[1:] and not t.startswith("--"):
            st.allexport = True
        elif t.startswith("+") and "a" in t[1:]:
            st.allexport = False
    if "allexport" in rtoks:
        st.allexport = rtoks[rtoks.index("allexport") - 1] == "-o"


def _assignments(st: _ScriptState, raw: str, rtoks: list[str], is_decl: bool, where: str) -> None:
    """``X=1 Y=2``, ``export X=1``, ``declare -x X``: record the values (an unknowable one as such) and exports."""
    head = rtoks[0]
    try:
        toks = shlex.split(_expand(raw, st.vars_, where, st.hint))
        err = None
    except BadInput as e:
        toks, err = rtoks, str(e)
    do_export = head == "export" or (head in ("declare", "typeset") and any(
        t.startswith("-") and "x" in t for t in rtoks[1:]))
    for t in toks[1:] if is_decl else toks:
        if t.startswith("-"):
            continue
        m = _ASSIGN_RE.match(t)
        name = m.group(1) if m else t if re.fullmatch(_NAME, t) else None
        if name is None:
            continue
        if m:
            st.vars_[name] = _Unresolvable(err) if err else m.group(2).replace(_ARGS_SENTINEL, "")
        if do_export or st.allexport:
            st.exported.add(name)


def _expanded_words(st: _ScriptState, raw: str, where: str) -> list[str]:
    expanded = _expand(raw, st.vars_, where, st.hint)
    try:
        toks = [t for t in shlex.split(expanded) if t != _ARGS_SENTINEL]
    except ValueError as e:
        raise BadInput(f"{where}: cannot be read as a shell command after expanding variables ({e})")
    if _ARGS_SENTINEL in expanded:
        st.notes.append(f"{where}: \"$@\" passes the script's own arguments to the engine; the gate checks the "
                        f"command without them")
    return [t.replace(_ARGS_SENTINEL, "") for t in toks]


def _command_env(st: _ScriptState, toks: list[str], start: int, where: str) -> dict[str, str]:
    """The engine's environment: exported variables (unknowable ones dropped, unless they shape memory),
    then the ``NAME=value`` words before the command."""
    inline: dict[str, str] = {}
    for t in toks[:start]:
        m = _ASSIGN_RE.match(t)
        if m:
            inline[m.group(1)] = m.group(2)
    cmd_env = {k: st.vars_[k] for k in st.exported if k in st.vars_}
    for k, v in list(cmd_env.items()):
        if isinstance(v, _Unresolvable):
            if k in fpmod.MEMORY_ENV:
                raise BadInput(f"{where}: ${k} cannot be resolved: {v}")
            del cmd_env[k]
    cmd_env.update(inline)
    return cmd_env


def _serve(st: _ScriptState, line: int, raw: str, where: str) -> None:
    toks = _expanded_words(st, raw, where)
    start = find_serve(toks)
    if start is None:
        raise BadInput(f"{where}: the serve command changed shape after expanding variables; write "
                       f"'vllm serve' literally")
    model, revision, pairs, cfgs = parse_serve_args(toks[start:], where)
    cmd_env = _command_env(st, toks, start, where)
    st.found.append(ServeCommand(line, model, revision, normalize_args(pairs, where, strict=False), cmd_env,
                                 cfgs, toks[start:], []))


def _command(st: _ScriptState, line: int, raw: str, where: str) -> None:
    """One simple command of the script: a builtin that matters, assignments, the serve command, or nothing."""
    try:
        rtoks = shlex.split(raw)
    except ValueError as e:
        raise BadInput(f"{where}: cannot be read as a shell command ({e})")
    if not rtoks or rtoks[0] in ("echo", "printf", ":", "true", "logger", "#"):
        return
    head = rtoks[0]
    if head == "set":
        _set_options(st, rtoks)
        return
    is_decl = head in ("export", "declare", "typeset", "readonly", "local")
    if is_decl or all(_ASSIGN_RE.match(t) for t in rtoks):
        _assignments(st, raw, rtoks, is_decl, where)
    elif find_serve(rtoks) is not None:
        _serve(st, line, raw, where)
    elif head in ("source", ".") and len(rtoks) > 1:
        st.notes.append(f"{where}: '{raw}' is not followed; the gate reads variables from the env file and "
                        f"the script's own assignments")


def parse_serve_script(text: str, origin: str, env: dict[str, str], env_origin: str | None = None) -> ServeCommand:
    """A shell script that starts ``vllm serve MODEL --flag value ...`` → the one serve command.

    Variables come from ``env`` (the env file listed alongside: the process environment) and from the
    script's own assignments (``X=...``, ``export X=...``, ``set -a``), in order. The engine's environment
    is the env file, the exported variables, and the ``NAME=value`` words before the command."""
    text = text.replace("\r\n", "\n")
    hint = f"not in {env_origin}, not assigned in the script" if env_origin else \
        "no env file is listed for this script (env_file:) and the script does not assign it"
    st = _ScriptState(dict(env), set(env), hint)
    for line, raw in _split_commands(text, origin):
        _command(st, line, raw, f"{origin}:{line}")
    if not st.found:
        raise BadInput(f"{origin}: no `vllm serve` command found (a serve script must start the engine with "
                       f"`vllm serve MODEL ...` or `python -m vllm.entrypoints.openai.api_server ...`)")
    if len(st.found) > 1:
        raise BadInput(f"{origin}: {len(st.found)} `vllm serve` commands (lines "
                       f"{', '.join(str(f.line) for f in st.found)}); a serve script must start exactly one engine")
    cmd = st.found[0]
    cmd.notes = st.notes
    return cmd
