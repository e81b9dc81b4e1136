"""Shell words without a shell: a serve script split into simple commands, and $VAR expansion in them."""
from __future__ import annotations

import re
import shlex

from oomdoctor.errors import BadInput

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN_RE = re.compile(rf"^({_NAME})=(.*)$", re.S)
_ARGS_SENTINEL = "\x00oomdoctor-args\x00"


class _Unresolvable(str):
    """A script variable whose value cannot be known statically (the reason is the string)."""


class _Splitter:
    """The state of :func:`_split_commands` while it walks the script one character (or construct) at a time."""

    def __init__(self, text: str):
        self.text, self.n, self.i = text, len(text), 0
        self.cmds: list[tuple[int, str]] = []
        self.buf: list[str] = []
        self.line = self.start = 1
        self.quote: str | None = None
        self.depth = 0                  # inside $( ... )
        self.heredocs: list[tuple[str, bool]] = []

    def take(self, s: str, lines: int = 0) -> bool:
        self.buf.append(s)
        self.i += len(s)
        self.line += lines
        return True

    def flush(self) -> None:
        s = "".join(self.buf).strip()
        if s:
            self.cmds.append((self.start, s))
        self.buf.clear()

    def in_quotes(self, c: str) -> bool:
        """Inside '...' everything is literal; inside "..." only a backslash is special (handled before)."""
        if self.quote is None:
            return False
        if c == self.quote:
            self.quote = None
        return self.take(c, lines=int(c == "\n"))

    def backslash(self) -> bool:
        t, i = self.text, self.i
        if t.startswith("\\\r\n", i) or t.startswith("\\\n", i):       # a line continuation
            self.i += 3 if t[i + 1] == "\r" else 2
            self.line += 1
            return True
        return self.take(t[i:i + 2])

    def opening(self, c: str) -> bool:
        t, i = self.text, self.i
        if c in ("'", '"'):
            self.quote = c
            return self.take(c)
        if c == "`":
            j = t.find("`", i + 1)
            j = self.n - 1 if j < 0 else j
            return self.take(t[i:j + 1], lines=t.count("\n", i, j + 1))
        if t.startswith("$(", i):
            self.depth += 1
            return self.take("$(")
        if self.depth and c == ")":
            self.depth -= 1
            return self.take(c)
        return False

    def comment_or_heredoc(self, c: str) -> bool:
        t, i = self.text, self.i
        if c == "#" and (not self.buf or self.buf[-1][-1:] in (" ", "\t", "\n", ";", "&", "|", "(")):
            j = t.find("\n", i)
            self.i = self.n if j < 0 else j
            return True
        if c == "<" and t.startswith("<<", i) and not t.startswith("<<<", i):
            m = re.match(r"<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2", t[i:])
            if m:
                self.heredocs.append((m.group(3), bool(m.group(1))))
                return self.take(m.group(0))
        return False

    def skip_heredoc_bodies(self) -> None:
        t, n = self.text, self.n
        for word, strip_tabs in self.heredocs:
            while self.i < n:
                j = t.find("\n", self.i)
                body_line = t[self.i:n if j < 0 else j]
                self.i = n if j < 0 else j + 1
                self.line += 1
                if (body_line.lstrip("\t") if strip_tabs else body_line) == word:
                    break
        self.heredocs.clear()

    def separator(self, c: str) -> bool:
        if self.depth or c not in ("\n", ";", "|", "&"):
            return False
        self.flush()
        self.i += 1
        if c == "\n":
            self.line += 1
            if self.heredocs:
                self.skip_heredoc_bodies()
        while self.i < self.n and self.text[self.i] in ("|", "&") and c in ("|", "&"):
            self.i += 1
        return True

    def step(self) -> None:
        c = self.text[self.i]
        if not self.buf:
            if c in (" ", "\t"):
                self.i += 1
                return
            self.start = self.line
        if self.quote == "'":
            self.in_quotes(c)
        elif c == "\\":
            self.backslash()
        elif not (self.in_quotes(c) or self.opening(c) or self.comment_or_heredoc(c) or self.separator(c)):
            self.take(c, lines=int(c == "\n"))


def _split_commands(text: str, origin: str) -> list[tuple[int, str]]:
    """A shell script → its simple commands as (line number, raw text): line continuations joined,
    comments dropped, split at unquoted newlines, ';', '&&', '||', '|' and '&'. Quotes are kept."""
    sp = _Splitter(text)
    while sp.i < sp.n:
        sp.step()
    if sp.quote:
        raise BadInput(f"{origin}:{sp.start}: unterminated {sp.quote} quote")
    sp.flush()
    return sp.cmds


def _escape(val: str, quote: str | None) -> str:
    if quote == '"':
        return val.replace("\\", "\\\\").replace('"', '\\"')
    return re.sub(r"([\\'\"])", r"\\\1", val)


_PARAM_RE = re.compile(rf"\$(?:\{{([^}}]*)\}}|({_NAME})|([0-9@*#?$!-]))")
_BRACE_RE = re.compile(rf"^({_NAME})(?:(:?[-=+?])(.*))?$", re.S)


def _lookup(name: str, vars_: dict[str, str], where: str, hint: str) -> str | None:
    v = vars_.get(name)
    if isinstance(v, _Unresolvable):
        raise BadInput(f"{where}: ${name} cannot be resolved: {v}")
    return v


def _param(m: re.Match, vars_: dict[str, str], where: str, hint: str) -> str:
    """The value of one ``$...`` match (an unset variable is an error); ``$@``/``$*`` give the args sentinel."""
    if m.group(3) is not None:
        if m.group(3) in ("@", "*"):
            return _ARGS_SENTINEL
        raise BadInput(f"{where}: ${m.group(3)} cannot be resolved without running the script")
    if m.group(2) is not None:
        name, op, word = m.group(2), None, ""
    else:
        bm = _BRACE_RE.match(m.group(1))
        if not bm:
            raise BadInput(f"{where}: ${{{m.group(1)}}} is not supported (use $VAR, ${{VAR}} or ${{VAR:-default}})")
        name, op, word = bm.group(1), bm.group(2), bm.group(3) or ""
    val = _lookup(name, vars_, where, hint)
    if op in (":-", ":=", "-", "="):
        if val is None or (op.startswith(":") and val == ""):
            val = _plain_word(word, vars_, where, hint)
            if op.endswith("="):
                vars_[name] = val
    elif op in (":+", "+"):
        val = _plain_word(word, vars_, where, hint) if (val is not None and (op == "+" or val != "")) else ""
    elif op in (":?", "?"):
        if val is None or (op == ":?" and val == ""):
            raise BadInput(f"{where}: ${name} is not set ({hint})")
    if val is None:
        raise BadInput(f"{where}: ${name} is not set ({hint}); the gate needs its value for the fingerprint")
    return val


def _expand(raw: str, vars_: dict[str, str], where: str, hint: str) -> str:
    """Expand $VAR, ${VAR}, ${VAR:-default} (and -, :=, =, :+, +) outside single quotes, escaping the
    values so that shlex then splits the words the way the shell would. Anything that cannot be known
    without running the script ($(...), `...`, $1) is an error naming the line."""
    out: list[str] = []
    quote: str | None = None
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if quote == "'" or c == "\\" or c == '"' or (c == "'" and quote is None):
            width = 2 if c == "\\" and quote != "'" else 1
            if quote == "'":
                quote = None if c == "'" else quote
            elif c == '"':
                quote = None if quote == '"' else '"'
            elif c == "'":
                quote = "'"
            out.append(raw[i:i + width])
            i += width
            continue
        if c == "`" or raw.startswith("$(", i):
            raise BadInput(f"{where}: a command substitution ({'`...`' if c == '`' else '$(...)'}) cannot be resolved "
                           f"without running the script; write the value, or set it in the env file")
        m = _PARAM_RE.match(raw, i) if c == "$" else None
        # a ${ with no closing brace after it is an error (bash: bad substitution); skipping it, the match at the
        # next ${ scanned the whole rest again: `${` x 40,000 took 25 s
        if m is None and raw.startswith("${", i):
            raise BadInput(f"{where}: ${{ without its closing }}")
        if m is None:
            out.append(c)
            i += 1
            continue
        val = _param(m, vars_, where, hint)
        out.append(val if val == _ARGS_SENTINEL else _escape(val, quote))
        i = m.end()
    return "".join(out)


def _plain_word(word: str, vars_: dict[str, str], where: str, hint: str) -> str:
    """The word of ${VAR:-word}: expanded, quotes removed."""
    exp = _expand(word, vars_, where, hint)
    try:
        toks = shlex.split(exp)
    except ValueError:
        return exp
    return " ".join(toks).replace(_ARGS_SENTINEL, "")
