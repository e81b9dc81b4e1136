"""Stage 1b — undo what pasting did to a log, before anything reads it.

A log a person pastes into a bug report, a forum or an e-mail has often been through a renderer on the way, and
what the renderer added is not the engine's text: every line quoted (``> `` of a reply, nested ``> > ``), every line
indented (a Markdown code block written by indentation, a list item), HTML escapes (``&quot;``, ``&#39;``, ``&lt;``
from a saved page or a mail), formatting tags (``<pre><code>``, ``<span ...>``), non-breaking spaces for the blanks
of an HTML copy, and long lines hard-wrapped at a terminal's width (``File ".../vllm/engine/multip`` then
``rocessing/engine.py", line 390, ...``). Each of these is undone only when the paste as a whole shows it:

* quote markers: at least half of the non-blank lines start with ``>`` (a Python prompt ``>>> `` is not one);
  the depth all of them share is removed;
* indentation: the leading blanks that every non-blank line (two or more) shares; a complete engine log always has
  lines at column 0. When the least indented lines are Python frame lines (``File "..."``), their two blanks stay;
* HTML: an entity reference (no engine prints one), or two formatting tags, one of them opening a line;
  ``<module>``, ``<eval_with_key>`` and the like are Python's, not HTML, and stay;
* non-breaking spaces: become spaces;
* Docker's json-file log (every line a JSON object with a "log" string): the text of the records;
* Kubernetes' CRI log file (`<RFC3339Nano> <stdout|stderr> <P|F> `): the pieces of a line longer than containerd's
  max_container_log_line_size (`P` records, then `F`) joined, per stream;
* colour codes whose ESC byte a copy dropped (``[0;36m(APIServer pid=1)[0;0m INFO ...``): removed, when two or more
  lines start with one;
* ``cat -n`` line numbers (every non-blank line numbered, one after the other, then a tab): removed;
* hard wraps: two or more different lines of one length W (60-512 characters) — or, in a paste of at most 20 lines none
  longer than W, its next-to-last line, of a usual width (80, 100, 120, 132 or 160), inside a word or after one blank
  into the last — break inside a word, a path, a
  figure or at one blank into a next line that starts no record of its own (no time stamp, level, process or
  launcher prefix, frame, ``Traceback``, exception, blank or indented line) and does not start like the line
  itself; then, when at least as many lines are W long as are longer (a paste of pieces may hold a few longer
  lines that no terminal wrapped; a long log's repeated multi-line record has many longer lines around it), every
  line of length W that goes on so is joined with its continuation(s).

Undoing a quote, an indentation or HTML keeps every line where it was, so the line numbers the card cites are the
paste's own; joining wrapped lines makes one line of several (the frames and the exception they belong to must
stay as near as the engine printed them), and the note says how many lines the paste had and has. Only a plain
file of at most ``PASTE_MAX_BYTES`` is looked at (a paste is small; a large log is an engine's own file, read as it
is; a Docker json-file log of any size, compressed or not, is streamed to its records' text by diagnose/collector.py);
a compressed or UTF-16 log is read as it is. Every test here is a linear pass; nothing is executed.
"""
from __future__ import annotations

import hashlib
import html
import os
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, TypeVar

from oomdoctor.diagnose import collector
from oomdoctor.diagnose.parse import WRAPPER_RE
from oomdoctor.diagnose.read import SourceInfo
from oomdoctor.errors import BadInput

PASTE_MAX_BYTES = 2 << 20
T = TypeVar("T")
WRAP_MIN, WRAP_MAX = 60, 512
# one wrapped line is enough in a short paste whose lines are none longer than a terminal's or a renderer's usual
# width (a 2- to 6-line paste of one long message); in a longer paste a line of any length occurs by chance
SINGLE_WRAP_WIDTHS, SINGLE_WRAP_MAX_LINES = (80, 100, 120, 132, 160), 20

_QUOTE_RE = re.compile(r"^ {0,3}((?:> ?){1,16})")
_QUOTED_BYTES_RE = re.compile(rb"(?m)^ {0,3}>")
_ENTITY_RE = re.compile(r"&(?:quot|apos|lt|gt|amp|nbsp|#\d{1,7}|#[xX][0-9a-fA-F]{1,6});")
_TAG_RE = re.compile(r"</?(?:pre|code|span|div|p|br|b|i|em|strong|h[1-6]|details|summary|kbd|samp|tt|font|"
                     r"blockquote|ul|ol|li|table|tr|td|th)(?:\s[^<>\n]{0,1000})?/?>", re.I)
_FRAME_RE = re.compile(r'^\s*File "')
# the shapes of a line that starts a record of its own (_starts_record)
_RECORD_RE = re.compile(
    r"^(?:\s*$|\s\s|\s+File \"|Traceback |(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b"
    r"|\([\w .:=,-]{0,80}pid=\d|\(raylet|\[\d{4}-\d\d-\d\d|\[[IWEF]\d{4} |\[[A-Za-z][\w/|.:-]{0,80}\]|\d{4}-\d\d-\d\d"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:|time=|[A-Za-z_][\w.]{0,200}(?:Error|Exception|Warning|Interrupt|Exit)\b"
    r"|main: |[a-z][a-z0-9]{0,31}_[a-z0-9_]{0,63}: "    # llama.cpp's "llama_model_load: ", "main: "
    r"|(?:srv|slot|que|cmn|mtmd|res|ctx) {1,12}[a-z_][a-z0-9_]{0,63}: )")   # llama-server's "srv    load_model: "
_SEPARATOR_RE = re.compile(r"^(.)\1*$")


def _starts_record(line: str) -> bool:
    """A line that starts a record of its own (the line before it was not wrapped into it): _RECORD_RE's shapes or
    a launcher's prefix (parse.WRAPPER_RE)."""
    return bool(_RECORD_RE.match(line) or WRAPPER_RE.match(line))
_LOGFMT_KEY_RE = re.compile(r"[A-Za-z_][\w.]{0,63}=")
_LOGFMT_END_RE = re.compile(r"(?:^| )[A-Za-z_][\w.]{0,63}=(?:\"[^\"]{0,400}\"|[^\s\"=]{1,400})$")


def _nonblank(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.strip()]


def _unhtml(lines: list[str], undone: list[str]) -> list[str]:
    entities = sum(len(_ENTITY_RE.findall(ln)) for ln in lines)
    tags = sum(len(_TAG_RE.findall(ln)) for ln in lines)
    # a prompt in a serving log may hold a tag or two: the page's own tags open lines (<pre><code>, <h1>)
    if not entities and not (tags >= 2 and any(_TAG_RE.match(ln.lstrip()) for ln in lines)):
        return lines
    undone.append("HTML tags and escapes removed")
    return [html.unescape(_TAG_RE.sub("", ln)) for ln in lines]


def _unquote(lines: list[str], undone: list[str]) -> list[str]:
    body = _nonblank(lines)
    depths = []
    for ln in body:
        m = _QUOTE_RE.match(ln)
        if m and not ln.lstrip().startswith(">>> "):
            depths.append(m.group(1).count(">"))
    if not body or len(depths) * 2 < len(body):
        return lines
    depth = min(depths)
    undone.append("'>' quote markers removed" if depth == 1 else f"{depth} levels of '>' quote markers removed")
    out = []
    for ln in lines:
        m = _QUOTE_RE.match(ln)
        if m and not ln.lstrip().startswith(">>> "):
            cut, seen = m.start(1), 0
            while seen < depth and cut < len(ln) and ln[cut] == ">":
                cut += 1
                seen += 1
                if cut < len(ln) and ln[cut] == " ":
                    cut += 1
            ln = ln[cut:]
        out.append(ln)
    return out


def _dedent(lines: list[str], undone: list[str]) -> list[str]:
    first = next((ln for ln in lines if ln.strip()), "")
    if first[:1] not in (" ", "\t"):         # a line at column 0: no margin is shared (the common case, at once)
        return lines
    body = _nonblank(lines)
    if len(body) < 2:           # one line's indentation may be its own (pydantic's "  Value error, ...")
        return lines
    margin = min(len(ln) - len(ln.lstrip(" \t")) for ln in body)
    if margin == 0:
        return lines
    prefix = body[0][:margin]
    if any(not ln.startswith(prefix) for ln in body):      # mixed tabs and blanks: not one shared margin
        return lines
    least = [ln for ln in body if len(ln) - len(ln.lstrip(" \t")) == margin]
    if all(_FRAME_RE.match(ln) for ln in least):        # a traceback's frames only: their own indentation stays
        margin -= 2
        if margin <= 0:
            return lines
    undone.append(f"an indentation of {margin} shared by every line removed")
    return [ln[margin:] if not ln[:margin].strip() else ln for ln in lines]


_DIGITS = str.maketrans("123456789", "000000000")


def _head(line: str) -> str:
    return line[:8].translate(_DIGITS)


def _wrap_width(lines: list[str], lens: list[int]) -> int | None:
    """The width the paste was hard-wrapped at, or None: the length (WRAP_MIN-WRAP_MAX) of the most lines that break
    inside a word, a path, a figure or at one blank (not between two) into a next line that is no record of its own
    and does not start like the line itself (a record repeated with figures of one width is not a wrap, nor is a
    table's row) — at least two such breaks of different lines, and no fewer lines of length W than lines longer
    than W."""
    breaks: dict[int, set[str]] = {}
    for i in range(len(lines) - 1):
        ln, nxt = lines[i].rstrip("\r"), lines[i + 1]
        if (WRAP_MIN <= lens[i] <= WRAP_MAX and nxt and not (ln[-1].isspace() and nxt[0].isspace())
                and _head(nxt) != _head(ln) and ln.count("|") < 3      # a table's rows are of one width too
                and not _starts_record(nxt)):
            breaks.setdefault(lens[i], set()).add(ln)
    # two different lines: one record repeated (a noisy rank's line between every other) is no wrap
    width, seen = max(breaks.items(), key=lambda kv: (len(kv[1]), kv[0]), default=(0, set()))
    if len(seen) < 2:
        return _single_wrap(lines, lens)
    # a terminal makes a W-wide piece of every longer line: few lines stay longer than W (a multi-line record
    # that a long log repeats is of one width too, among many longer lines)
    return width if lens.count(width) >= sum(1 for n in lens if n > width) else None


def _single_wrap(lines: list[str], lens: list[int]) -> int | None:
    """A short paste (SINGLE_WRAP_MAX_LINES) that ends in a long line broken once at a usual width W
    (SINGLE_WRAP_WIDTHS) — inside a word or after one blank — and has no line longer than W (a terminal cuts a long
    line into W-wide pieces): W. Its last line is the piece; the line before it is W long."""
    body = [i for i, ln in enumerate(lines) if ln.strip()]
    if len(lines) > SINGLE_WRAP_MAX_LINES or len(body) < 2 or body[-2] != body[-1] - 1:
        return None
    i = body[-2]
    ln, nxt = lines[i].rstrip("\r"), lines[i + 1]
    inside = (ln[-1].isalnum() and nxt[0].isalnum()) or (ln[-1] == " " and ln[-2:-1] != " " and not nxt[0].isspace())
    if lens[i] in SINGLE_WRAP_WIDTHS and max(lens) <= lens[i] and inside and not _starts_record(nxt):
        return lens[i]
    return None


def _unwrap(lines: list[str], undone: list[str]) -> list[str]:
    lens = [len(ln.rstrip("\r")) for ln in lines]
    width = _wrap_width(lines, lens)
    if width is None:
        return lines

    def goes_on(i: int) -> bool:
        return (lens[i] == width and i + 1 < len(lines) and not _SEPARATOR_RE.match(lines[i].rstrip("\r"))
                and not _starts_record(lines[i + 1]))
    out = []
    i = 0
    while i < len(lines):
        j = i
        joined = lines[i].rstrip("\r")
        while goes_on(j):
            j += 1
            # a logfmt field ("layers.split=...", Ollama's and TGI's records) after a whole one ("layers.offload=44")
            # is a word of its own: the renderer wrapped at the blank between them and dropped it (a terminal
            # breaks anywhere, "level=INFO sour" / "ce=memory.go:309", and drops nothing)
            blank = _LOGFMT_KEY_RE.match(lines[j]) and _LOGFMT_END_RE.search(joined[-480:])   # bounded: linear
            joined += (" " if blank else "") + lines[j].rstrip("\r")
        out.append(joined if j > i else lines[i])
        i = j + 1
    undone.append(f"lines hard-wrapped at {width} characters joined (line numbers count the joined lines: the "
                  f"paste's {len(lines)} are {len(out)})")
    return out


def _docker_json(lines: list[str], undone: list[str]) -> list[str]:
    """Docker's json-file log (/var/lib/docker/containers/<id>/<id>-json.log): one JSON object per line, the output's
    text in "log" (moby b985e2313a daemon/logger/jsonfilelog/jsonlog/jsonlog.go:8-17: log, stream, time, attrs). A
    piece of a long line has no newline at its end and goes on in the next object."""
    body = _nonblank(lines)
    if not body or not all(ln.lstrip().startswith('{"') for ln in body[:8]):
        return lines
    texts = []
    for ln in body:
        text = collector.record_text(ln)
        if text is None:
            return lines
        texts.append(text)
    undone.append(f"Docker's json-file records read ({len(texts)}): their \"log\" text")
    return "".join(texts).rstrip("\n").split("\n")


_NUMBERED_RE = re.compile(r"^ {0,12}(\d{1,12})\t")


def _unnumber(lines: list[str], undone: list[str]) -> list[str]:
    """``cat -n`` / ``nl``'s line numbers: the number right-aligned in six columns and a tab before every line
    (coreutils aa0c0de35 src/cat.c:62-78 line_buf; ``cat -b`` numbers the non-blank lines only): all of them, one
    after the other."""
    nums = [m for m in (_NUMBERED_RE.match(ln) for ln in lines) if m]
    body = _nonblank(lines)
    if len(nums) < 2 or len(nums) < len(body):
        return lines
    if any(int(b.group(1)) != int(a.group(1)) + 1 for a, b in zip(nums, nums[1:])):
        return lines
    undone.append("cat -n line numbers removed")
    return [ln[m.end():] if (m := _NUMBERED_RE.match(ln)) else ln for ln in lines]


# Kubernetes' CRI log file record: "<RFC3339Nano> <stdout|stderr> <P|F> <text>" (containerd 301026e58
# internal/cri/io/logger.go: the headers time, stream, tag each followed by ' '; a line longer than containerd's
# max_container_log_line_size is written as "P" records and its last piece as "F")
_CRI_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) (stdout|stderr) ([PF]) ")
_CRI_BYTES_RE = re.compile(rb"(?m)^\d{4}-\d\d-\d\dT[\d:.]{8,18}(?:Z|[+-]\d\d:\d\d) std(?:out|err) P ")


def _cri_partial(lines: list[str], undone: list[str]) -> list[str]:
    """A CRI log file's partial records joined with the rest of their line (its later records lose their header)."""
    out: list[str] = []
    joined = 0
    pending: dict[str, int] = {}          # stream → the record its next piece belongs to (the streams interleave)
    for ln in lines:
        m = _CRI_RE.match(ln)
        if m is None:
            out.append(ln)
            continue
        stream = m.group(1)
        if stream in pending:
            at = pending[stream]
            out[at] += ln[m.end():]
            joined += 1
        else:
            at = len(out)
            out.append(ln)
        if m.group(2) == "P":
            pending[stream] = at
        else:
            pending.pop(stream, None)
    if joined:
        undone.append(f"CRI partial records joined ({joined} pieces of long lines)")
    return out


# a colour code whose ESC byte a copy dropped: "[0;36m(APIServer pid=2156201)[0;0m INFO ..." (vLLM's coloured process
# prefix, copied from a terminal or a web console that kept the rest of the code; a committed real log of held-out
# set 14 has it). Undone only when lines start with one, the shape of a coloured prefix or level
_BARE_SGR_RE = re.compile(r"(?<!\x1b)\[(?:\d{1,3};){0,4}\d{1,3}m")
_BARE_SGR_LEAD_RE = re.compile(r"[^\n\[\x1b]{0,64}\[(?:\d{1,3};){0,4}\d{1,3}m(?:\(|INFO|WARNING|ERROR|DEBUG)")


def _bare_sgr(lines: list[str], undone: list[str]) -> list[str]:
    leading = sum(1 for ln in lines if _BARE_SGR_LEAD_RE.match(ln))
    if leading < 2:
        return lines
    undone.append(f"colour codes without their ESC byte removed ({leading} lines started with one)")
    return [_BARE_SGR_RE.sub("", ln) for ln in lines]


def undo(data: bytes) -> tuple[bytes, list[str]]:
    """(the paste's text with what pasting added undone, what was undone); the input itself when nothing was."""
    undone: list[str] = []
    lines = data.decode("utf-8", errors="surrogateescape").split("\n")
    if data.lstrip()[:2] == b'{"':
        lines = _docker_json(lines, undone)
    if _CRI_BYTES_RE.search(data):
        lines = _cri_partial(lines, undone)
    if b"m(" in data or b"mINFO" in data or b"mWARNING" in data or b"mERROR" in data:
        lines = _bare_sgr(lines, undone)
    if b"&" in data or b"<" in data:
        lines = _unhtml(lines, undone)
    if b"\xc2\xa0" in data:
        lines = [ln.replace("\u00a0", " ") for ln in lines]
        undone.append("non-breaking spaces made spaces")
    if _QUOTED_BYTES_RE.search(data) or undone:
        lines = _unquote(lines, undone)
    if b"\t" in data:
        lines = _unnumber(lines, undone)
    lines = _dedent(lines, undone)
    lines = _unwrap(lines, undone)
    if not undone:
        return data, []
    return "\n".join(lines).encode("utf-8", errors="surrogateescape"), undone


def _plain_small(path: Path) -> bytes | None:
    """The bytes of a plain (not compressed, not UTF-16) regular file of at most PASTE_MAX_BYTES, else None."""
    from oomdoctor.diagnose.feed import ZSTD_MAGIC
    from oomdoctor.diagnose.read import GZIP_MAGIC, UTF16_BOMS, open_regular

    try:
        with open_regular(path) as f:
            if os.fstat(f.fileno()).st_size > PASTE_MAX_BYTES:
                return None
            data = f.read(PASTE_MAX_BYTES + 1)
    except Exception:           # what cannot be read is refused by the reader itself, with its message
        return None
    if len(data) > PASTE_MAX_BYTES or data.startswith((GZIP_MAGIC, ZSTD_MAGIC) + UTF16_BOMS):
        return None
    return data


@dataclass(frozen=True)
class Paste:
    path: Path                  # what to read: the log itself, or the private copy with the paste's additions undone
    undone: list[str]           # what was undone (empty: nothing; ``path`` is the log)
    sha256: str = ""            # of the log as given (the copy's own bytes differ)
    size_bytes: int = 0
    read_as: str = "a pasted log"   # how the card's note names it


@contextmanager
def _private_copy(path: Path, write: Callable[[BinaryIO], T]) -> Iterator[tuple[Path, T]]:
    """A private file (its own directory, created, never followed, removed on exit) that ``write`` fills: (its path,
    what ``write`` returned). A BadInput raised while it is read names ``path``, never the copy."""
    with tempfile.TemporaryDirectory(prefix="oomdoctor-paste-") as d:
        tmp = Path(d) / "paste.log"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            result = write(f)
        try:
            yield tmp, result
        except BadInput as e:
            raise BadInput(str(e).replace(str(tmp), str(path))) from None


@contextmanager
def readable(path: str | os.PathLike) -> Iterator[Paste]:
    """The log to read for ``path``: itself, or a private copy with what pasting added undone (removed on exit; a
    BadInput raised while it is read names ``path``, as read.log_source's spooled stdin names ``<stdin>``)."""
    path = Path(path)
    data = _plain_small(path)
    if data is None and collector.is_docker_json(path):
        # a Docker json-file log too large for a paste (or compressed): its records' text, streamed to the copy
        info = SourceInfo(str(path))
        with _private_copy(path, lambda f: collector.write_docker_text(path, f, info)) as (tmp, records):
            yield Paste(tmp, [f"the text of its {records} records (line numbers count that text's lines)"],
                        info.sha256, info.size_bytes, read_as="Docker's json-file log")
        return
    text, undone = undo(data) if data else (b"", [])
    if not undone or data is None:
        yield Paste(path, [])
        return
    with _private_copy(path, lambda f: f.write(text)) as (tmp, _):
        yield Paste(tmp, undone, hashlib.sha256(data).hexdigest(), len(data))
