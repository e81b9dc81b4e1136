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
    # Ray prints "(pid=N)" for a nameless worker and "(Name pid=N)" with an actor's or task's name, which may hold
    # '.' and ':' (Serve's "ServeReplica:<app>:<deployment>", ray 2.40.0 serve/_private/common.py:29)
    r"(?:\((?:[A-Za-z][\w\-.: =]*? )?pid=\d+(?:, ip=[\w.:]+)?\) (?=\())?"   # the outer one of two: the inner names the line
    r"(?:\((?:(?P<proc>[A-Za-z][\w\-.: =]*?) )?pid=(?P<pid>\d+)(?:, ip=[\w.:]+)?\)(?:\[[\d;]*m)? )?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[?(?P<file>[^\]:\s]+):(?P<line>\d+)\] )?"   # V0 (< 0.7) prints "file.py:N] " without the bracket
    r"(?P<msg>.*)$",
    re.S,
)
SGLANG_RE = re.compile(r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?: (?P<proc>(?:DP\d+ )?(?:TP\d+|EP\d+|PP\d+)[^\]]*))?\] (?P<msg>.*)$", re.S)
# What launchers and collectors put in FRONT of the engine's own line (stripped before the engine's prefix is parsed;
# the rules still see the whole line too). Each form is the one its tool prints (source named), bounded, one
# quantifier per run, digit-uniform (the shape cache masks digits, shapes.py), and none is a bare "word: ":
# * docker compose "svc-1  | ";
# * ISO/CI timestamps with an optional level word and "(Process)" ("2026-03-04 18:02:11.408 [Error] (Process) ");
#   a level word that vLLM's own "MM-DD HH:MM:SS" follows is vLLM's header, not the collector's (docker logs -t),
#   and only a level's name is one (a message's "CUDA error: ..." after a time stamp is the message);
#   Kubernetes' CRI log files (/var/log/pods/..., what `kubectl logs` reads) put "<RFC3339Nano> <stdout|stderr> <P|F> "
#   before every line (containerd 301026e58 internal/cri/io/logger.go:33-38 and :133-145: time, stream, tag, each
#   followed by ' ');
# * torchrun's per-worker tee header "[{role}{local_rank}]:" (torch 2.5.1 distributed/elastic/multiprocessing/
#   tail_log.py:121, written right before the line, no space; role "default" unless --role: distributed/run.py:520)
#   and torch's "[rank{N}]:" (torch/_logging/_internal.py:808; a space follows in the relayed tracebacks);
# * torchx / NeMo-Run log multiplexing "{role}/{replica_id} " (torchx 0.7.0 cli/cmd_log.py:75; NeMo-Run
#   nemo_run/run/logs.py:66 prints the role's last 10 characters: "nemo-run-1/0 "): the role holds a letter, so a
#   bare "3/35 " (a progress count) is not taken for one;
# * kubectl logs --prefix "[pod/<pod>/<container>] " (the form NeMo-Run's kubeflow.py:466-497 parses back; pod and
#   container names are DNS-1123: lower-case letters, digits, '-' and '.');
# * SLURM srun --label "%*d: " (the task id right-aligned to the width of the largest; hetjobs "P%u %*d: "):
#   slurm src/common/write_labelled_message.c _build_label; digits only, so no word before ": " is taken for one;
# * Ray's raylet lines "(raylet) " / "(raylet, ip=A) " (ray 2.40.0 _private/worker.py:2065-2149, print_worker_logs);
#   its worker prefixes "(pid=N)", "(Name pid=N, ip=A)" keep their process and are read by VLLM_RE;
# * journald's "<time> <host> <identifier>[<pid>]: " in each of journalctl's short forms, as systemd 252's journalctl
#   printed them on a real journal (-o short, the default, and syslog: "Dec 01 21:35:35"; short-precise
#   "Dec 01 21:35:35.444726"; short-iso "2026-12-01T21:35:35+0000", short-iso-precise with microseconds; short-full
#   and with-unit "Tue 2026-12-01 21:35:35 UTC"; short-unix "1796160935.444726"); the host is no level's name, so a
#   collector's "<ISO time> INFO logger: " keeps its level word.
# Not stripped: pdsh's "hostname: " (pdsh 2.34 man page, -N "Disable hostname: prefix"): a host name is any word, and
# "word: " is the engine's own text too (llama.cpp's "llama_model_load: ", Python's "ERROR: ").
WRAPPER_RE = re.compile(
    r"^(?:[\w.-]{1,64} {0,8}\| "
    r"|\[[A-Za-z][\w-]{0,31}?\d{1,5}\]: ?"                         # torchrun's tee header, torch's per-rank relay
    r"|(?=[\w.-]{0,63}[A-Za-z])[\w.-]{1,64}/\d{1,6} "                # torchx / NeMo-Run "{role}/{replica} "
    r"|\[pod/[a-z0-9][a-z0-9.-]{0,252}/[a-z0-9][a-z0-9.-]{0,62}\] "  # kubectl logs --prefix
    r"|(?:P\d{1,10} )? {0,9}\d{1,10}: "                               # srun --label
    r"|\(raylet(?:, ip=[\w.:]{1,64})?\) "
    r"|(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{6})?"                # journalctl -o short, short-precise
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?[+-]\d\d:?\d\d"            # short-iso, short-iso-precise
    r"|[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{6})? (?:[A-Z]{2,5}|[+-]\d\d(?:\d\d)?)"  # short-full
    r"|\d{9,11}\.\d{6})"                                                  # short-unix
    r" (?!(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|FATAL|CRITICAL) )[\w.-]{1,64} [\w.@/-]{1,64}(?:\[\d{1,10}\])?: "
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?Z?(?: ?[+-]\d\d:?\d\d)? {1,4}(?:std(?:out|err) [PF] )?"
    r"(?:-? ?(?:\[[A-Za-z]{1,10}\]|(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|FATAL|CRITICAL)) (?:- )?"
    r"(?!\d\d-\d\d \d\d:))?(?:\(\w{1,32}\) )?)"
)
MAX_WRAPPERS = 4    # nested: "[pod/p/c] 2026-06-01T10:00:01.5Z [default0]:[rank0]: " is four
# Ray's log deduplication appends " [repeated Nx across cluster]" (once with a note in parentheses) to a line it
# stands for (ray 2.40.0 _private/ray_logging/__init__.py:228-231 DedupState.formatted, :355 _warn_once): not the
# engine's text, so the message ends before it (a traceback frame's rule is anchored at the end of the line).
RAY_DEDUP_RE = re.compile(r" \[repeated \d{1,9}x across cluster\](?: \(Ray deduplicates logs by default\.[^)]{0,400}\))?$")
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
            return f"{self.proc} pid={self.pid}" if self.proc else f"pid={self.pid}"
        return self.proc

    @property
    def rank(self) -> int | None:
        m = RANK_RE.search(self.proc)
        return int(m.group(1)) if m else None


def decode(raw: bytes) -> str:
    if b"\x1b" in raw:        # strip colour codes before decoding: one inside a UTF-8 sequence must not break it
        raw = ANSI_BYTES_RE.sub(b"", raw)
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


def header(text: str) -> tuple[re.Match[str] | None, int, str, bool]:
    """The engine's header of a line: (the SGLang or vLLM header match on the line's body, where the body starts in
    the line, the body — the line without its wrapper prefixes and Ray's dedup suffix —, whether it is SGLang's).
    parse_line reads the line from it; shapes.ts_span takes the time stamp's place from it."""
    if text.startswith("[") and (m := SGLANG_RE.match(text)):
        return m, 0, text, True
    body = text
    for _ in range(MAX_WRAPPERS):          # a wrapper prefix, possibly inside another (compose + timestamp)
        w = WRAPPER_RE.match(body)
        if not w:
            break
        body = body[w.end():]
    at = len(text) - len(body)
    if "across cluster]" in body and (d := RAY_DEDUP_RE.search(body)):
        body = body[:d.start()]
    if at and body.startswith("[") and (m := SGLANG_RE.match(body)):    # SGLang's line behind a wrapper
        return m, at, body, True
    return VLLM_RE.match(body), at, body, False


def parse_line(n: int, raw: bytes | str) -> LogLine:
    text = decode(raw) if isinstance(raw, (bytes, bytearray)) else ANSI_RE.sub("", raw).rstrip("\r\n")
    m, _, body, sglang = header(text)
    if m is not None and sglang:
        return LogLine(n, text, m.group("msg"), proc=(m.group("proc") or "").strip(), ts=m.group("ts"))
    if not m:  # pragma: no cover - the pattern matches every string
        return LogLine(n, text, text)
    msg = m.group("msg")
    if not m.group("pid") and not m.group("level"):
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
