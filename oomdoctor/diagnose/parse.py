"""Stage 2 — parse: turn a raw line into a LogLine (process prefix, level, time, source, message).

Handles what engines put around their messages: ANSI colour codes, a trailing ``\\r``
(vLLM's multi-line records), the V1 process prefix ``(EngineCore_DP0 pid=123)`` /
``(Worker_TP1 pid=..)`` / ``(VllmWorker rank=1 pid=..)``, the logging header
``INFO 07-26 12:00:00 [gpu_worker.py:123]`` and SGLang's ``[2025-01-01 12:00:00 TP0]``.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

_intern = sys.intern

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ANSI_BYTES_RE = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")

# docs/vllm-messages.md §2.2, extended with the DEBUG-mode relative file paths.
VLLM_RE = re.compile(
    r"^(?P<vprefix>[^(\x1b]*?)"
    # Ray adds ", ip=A" and nests its worker prefix after the engine core's; a paste may keep "[0;0m" colour debris
    r"(?:\((?:[A-Za-z][\w\- =]*? pid=\d+)\) (?=\())?"
    r"(?:\((?P<proc>[A-Za-z][\w\- =]*?) pid=(?P<pid>\d+)(?:, ip=[\w.:]+)?\)(?:\[[\d;]*m)? )?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[?(?P<file>[^\]:\s]+):(?P<line>\d+)\] )?"   # V0 (< 0.7) prints "file.py:N] " without the bracket
    r"(?P<msg>.*)$",
    re.S,
)
SGLANG_RE = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: (?P<proc>(?:DP\d+ )?(?:TP\d+|EP\d+|PP\d+)[^\]]*))?\] (?P<msg>.*)$", re.S)
# What launchers and collectors put in FRONT of the engine's own line (stripped before the engine's prefix is parsed;
# the rules still see the whole line too): docker compose "svc-1  | ", ISO/CI timestamps with an optional level word
# and "(Process)" ("2026-03-04 18:02:11.408 [Error] (Process) "), torch's "[rank0]: ", journald/syslog "Dec 01 12:00:00 host unit[12]: ",
# Ray's dedup/driver prefixes are handled by VLLM_RE ("(RayWorkerWrapper pid=N, ip=A)"). One quantifier per run.
WRAPPER_RE = re.compile(
    r"^(?:[\w.-]{1,64} {0,8}\| "
    r"|\[rank\d{1,5}\]: "                                            # torch.distributed's per-rank relay
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?Z?(?: ?[+-]\d\d:?\d\d)? {1,4}"
    r"(?:-? ?(?:\[[A-Za-z]{1,10}\]|[A-Z]{4,8}) (?:- )?)?(?:\(\w{1,32}\) )?"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]{1,64} [\w.@/-]{1,64}(?:\[\d{1,10}\])?: )"
)
RANK_RE = re.compile(r"(?:TP|rank[ =_]?)(\d+)", re.I)


@dataclass(frozen=True, slots=True)
class LogLine:
    n: int                 # 1-based line number in the file
    text: str              # the whole line, decoded, ANSI and trailing \r removed
    msg: str               # the message without process prefix and logging header
    proc: str = ""         # process name, e.g. "EngineCore", "Worker_TP1", "VllmWorker rank=1"
    pid: str = ""
    level: str = ""
    ts: str = ""
    src: str = ""          # "gpu_worker.py:538"

    @property
    def process(self) -> str:
        """A stable key for the emitting process ("" when the line carries none)."""
        if self.pid:
            return f"{self.proc} pid={self.pid}"
        return self.proc

    @property
    def rank(self) -> int | None:
        m = RANK_RE.search(self.proc)
        return int(m.group(1)) if m else None


def decode(raw: bytes) -> str:
    if b"\x1b" in raw:        # strip colour codes before decoding: one inside a UTF-8 sequence must not break it
        raw = ANSI_BYTES_RE.sub(b"", raw)
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


def parse_line(n: int, raw: bytes | str) -> LogLine:
    text = decode(raw) if isinstance(raw, (bytes, bytearray)) else ANSI_RE.sub("", raw).rstrip("\r\n")
    if text.startswith("[") and (m := SGLANG_RE.match(text)):
        return LogLine(n, text, m.group("msg"), proc=(m.group("proc") or "").strip(), ts=m.group("ts"))
    body = text
    for _ in range(2):                     # a wrapper prefix, possibly inside another (compose + timestamp)
        w = WRAPPER_RE.match(body)
        if not w:
            break
        body = body[w.end():]
    m = VLLM_RE.match(body)
    if not m:  # pragma: no cover - the pattern matches every string
        return LogLine(n, text, text)
    msg = m.group("msg")
    if not m.group("proc") and not m.group("level"):
        msg = body  # no engine prefix: the line without its wrapper (the whole line when it had none)
    proc, pid, level, ts, file, src_line = m.group("proc", "pid", "level", "ts", "file", "line")
    # the process, pid, level and source of a line repeat thousands of times in a serving log:
    # one shared string each keeps the matches held in memory small
    return LogLine(
        n, text, msg.rstrip("\r"),
        proc=_intern(proc) if proc else "", pid=_intern(pid) if pid else "",
        level=_intern(level) if level else "", ts=ts or "",
        src=_intern(f"{file}:{src_line}") if file else "",
    )
