"""Job runners and log collectors put their own prefix in front of every line of an engine's output (issue 12: a
NeMo-Run paste's ``nemo-run-1/0 Traceback (most recent call last):`` hid its exception line from the rules anchored
at the line's start). ``parse.WRAPPER_RE`` strips the forms the tools print (each from the tool's source, named in
parse.py), and nothing that is the engine's own text.

The property: every field-guide paste with every line behind a runner's prefix is diagnosed as without it.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import assert_reads_as, assert_render_reads_as

from oomdoctor.diagnose import parse
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.parse import parse_line
from oomdoctor.diagnose.rules import default_rules
from oomdoctor.diagnose.shapes import digit_uniform

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
RULES = default_rules()

# (prefix as the tool prints it, where the form comes from)
PREFIXES = [
    ("nemo-run-1/0 ", "NeMo-Run nemo_run/run/logs.py:66: f'{role_name[-10:]}/{replica_id} ' (torchx cmd_log.py:75)"),
    ("[pod/vllm-0/vllm] 2026-06-01T10:00:01.000000000Z [default0]:[rank0]: ",
     "kubectl logs --prefix --timestamps, then torchrun's tee header and torch's per-rank relay (four nested)"),
    (" 3: ", "srun --label: '%*d: ', the task id right-aligned (slurm write_labelled_message.c)"),
    ("2026-06-01T10:00:01.123456789Z stderr F ", "Kubernetes' CRI log file: time, stream, tag (containerd logger.go)"),
    ("(pid=1234, ip=10.0.0.2) ", "Ray's nameless worker prefix (ray _private/worker.py print_worker_logs)"),
    ("(ServeReplica:default:VLLMDeployment pid=1234) ", "Ray Serve's replica actor (ray serve/_private/common.py:29)"),
    # journalctl (systemd 252) of a unit's output, each -o form as it printed it on a real journal (systemd-cat -t vllm)
    ("Dec 01 21:35:35 vm vllm[23759]: ", "journalctl -o short (the default): syslog time, host, identifier[pid]"),
    ("2026-12-01T21:35:35+0000 vm vllm[23759]: ", "journalctl -o short-iso"),
    ("2026-12-01T21:35:35.444726+0000 vm vllm[23759]: ", "journalctl -o short-iso-precise"),
    ("Dec 01 21:35:35.444726 vm vllm[23759]: ", "journalctl -o short-precise"),
    ("Tue 2026-12-01 21:35:35 UTC vm vllm[23759]: ", "journalctl -o short-full (and -o with-unit)"),
    ("1796160935.444726 vm vllm[23759]: ", "journalctl -o short-unix"),
]


# field-guide pastes hard-wrapped at a terminal's width, joined back by diagnose/paste.py when read as they are
REWRAPPED = {"vllm-v0p-019.log", "oe-032.log"}


def _key(d):
    return d.klass, d.phase, d.engine, d.rule, d.root.n if d.root else None


@pytest.fixture(scope="module")
def plain():
    return {p.name: _key(diagnose_file(p, RULES)) for p in sorted((LOGS / "field-guide").glob("*.log"))}


def _changed(plain, tmp_path, render, root_line_may_move=frozenset()):
    """The field-guide pastes whose diagnosis ``render`` (of the paste's text) changes: "name: before -> after"."""
    changed = []
    for name, want in plain.items():
        text = (LOGS / "field-guide" / name).read_text(encoding="utf-8", errors="replace")
        q = tmp_path / name
        q.write_text(render(text), encoding="utf-8")
        got = _key(diagnose_file(q, RULES))
        if name in root_line_may_move:
            got, want = got[:4], want[:4]
        if got != want:
            changed.append(f"{name}: {want} -> {got}")
    return changed


@pytest.mark.parametrize("prefix", [p for p, _ in PREFIXES], ids=[p.strip() for p, _ in PREFIXES])
def test_a_runners_prefix_on_every_line_changes_no_diagnosis(prefix, plain, tmp_path):
    # the prefix after its terminal's wrap: no runner relays a piece of a line, so the wrap stays (paste.py); only
    # the root's line number of a wrapped paste may differ
    changed = _changed(plain, tmp_path, lambda text: "".join(prefix + line for line in text.splitlines(True)),
                       root_line_may_move=REWRAPPED)
    assert not changed, "\n".join(changed)


def test_rays_dedup_suffix_changes_no_diagnosis(plain, tmp_path):
    # ray 2.40.0 _private/ray_logging/__init__.py:228-231: " [repeated Nx across cluster]" after a deduplicated line
    changed = _changed(plain, tmp_path,
                       lambda text: "".join(line + " [repeated 3x across cluster]\n" for line in text.splitlines()))
    assert not changed, "\n".join(changed)


@pytest.mark.parametrize("line,msg,proc,pid,level", [
    # NeMo-Run / torchx: "{role}/{replica} " (the role may be cut to its last 10 characters)
    ("nemo-run-1/0 Traceback (most recent call last):", "Traceback (most recent call last):", "", "", ""),
    ("nemo-run-0/0 WARNING 10-01 11:56:48 cuda.py:22] msg", "msg", "", "", "WARNING"),
    ("3-8b-sft-0/1 RuntimeError: x", "RuntimeError: x", "", "", ""),
    ("trainer/0 (EngineCore_DP0 pid=12) ERROR 01-01 12:00:00 [core.py:1] boom", "boom", "EngineCore_DP0", "12", "ERROR"),
    # torchrun --tee: "[{role}{local_rank}]:" with no space, then torch's "[rank{N}]: "
    ("[default0]:Traceback (most recent call last):", "Traceback (most recent call last):", "", "", ""),
    ("[default0]:[rank0]: torch.OutOfMemoryError: CUDA out of memory.", "torch.OutOfMemoryError: CUDA out of memory.",
     "", "", ""),
    ("[trainer12]:INFO 01-01 12:00:00 [a.py:3] m", "m", "", "", "INFO"),
    # kubectl logs --prefix
    ("[pod/vllm-7d9f-abcde/vllm] RuntimeError: x", "RuntimeError: x", "", "", ""),
    # srun --label, hetjob "P%u %*d: "
    ("0: RuntimeError: x", "RuntimeError: x", "", "", ""),
    ("  7: (VllmWorker rank=7 pid=99) ERROR 01-01 12:00:00 [w.py:1] e", "e", "VllmWorker rank=7", "99", "ERROR"),
    ("P1  3: RuntimeError: x", "RuntimeError: x", "", "", ""),
    # Ray: nameless worker, raylet, Serve's replica name with ':'
    ("(pid=4321) RuntimeError: x", "RuntimeError: x", "", "4321", ""),
    ("(pid=4321, ip=10.0.0.2) RuntimeError: x", "RuntimeError: x", "", "4321", ""),
    ("(raylet, ip=10.0.0.2) A worker died", "A worker died", "", "", ""),
    ("(ServeReplica:default:VLLMDeployment pid=5) ERROR 01-01 12:00:00 [a.py:1] e", "e",
     "ServeReplica:default:VLLMDeployment", "5", "ERROR"),
    # Ray's dedup suffix is not the engine's text (a frame's rule is anchored at the end of the line)
    ('(RayWorkerWrapper pid=5) File "/v/vllm/worker.py", line 3, in profile_run [repeated 7x across cluster]',
     'File "/v/vllm/worker.py", line 3, in profile_run', "RayWorkerWrapper", "5", ""),
    # journalctl's short forms (systemd 252), a vLLM line behind each; a collector's ISO time then a level keeps it
    ("2026-12-01T21:35:35+0000 vm vllm[23759]: (EngineCore pid=1098) ERROR 11-29 15:05:57 [core.py:1231] e", "e",
     "EngineCore", "1098", "ERROR"),
    ("2026-12-01T21:35:35.445983+00:00 gpu-node-3 python3[7]: RuntimeError: x", "RuntimeError: x", "", "", ""),
    ("Tue 2026-12-01 21:35:35 UTC vm vllm[23759]: INFO 11-29 15:05:31 [model.py:1776] m", "m", "", "", "INFO"),
    ("Dec 01 21:35:35.444726 vm vllm[23759]: RuntimeError: x", "RuntimeError: x", "", "", ""),
    ("1796160935.444726 vm vllm[23759]: RuntimeError: x", "RuntimeError: x", "", "", ""),
    ("2026-12-01T21:35:35+0000 INFO server: started", "server: started", "", "", ""),
    # SGLang's own header behind a runner's prefix
    ("nemo-run-1/0 [2025-01-01 12:00:00 TP0] Scheduler hit an exception: x", "Scheduler hit an exception: x", "TP0", "",
     ""),
])
def test_runner_prefix_is_stripped(line, msg, proc, pid, level):
    ln = parse_line(1, line)
    assert (ln.msg, ln.proc, ln.pid, ln.level) == (msg, proc, pid, level)


@pytest.mark.parametrize("line", [
    # a bare "word: " is the engine's own text (llama.cpp's function names, LMDeploy's HINT, Python's exceptions):
    # pdsh's "host: " prefix cannot be told from it, so it is not stripped
    "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
    "HINT:    Please open an issue",
    "ERROR: out of memory",
    "node01: RuntimeError: x",
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
    # a progress count is no torchx replica: the role holds a letter
    "3/35 [00:01<00:02, 12.1it/s]",
    "100/200 done",
    # Python's OSError text, c10's glog warning, a clock, a bracketed word without a number
    "[Errno 12] Cannot allocate memory",
    "[W1107 12:00:00.000000 ProcessGroupNCCL.cpp:1] Warning: x",
    "12:00:00 something",
    "[rank]: x",
    "[pod/Upper/x] y",          # kubectl names are DNS-1123 (lower case)
    "(autoscaler +1m2s) Resized",
])
def test_engine_text_is_not_taken_for_a_prefix(line):
    assert parse_line(1, line).msg == line


def test_wrapper_pattern_is_digit_uniform():
    # the shape cache (shapes.py) replays a line's parse on every line of its digit-masked shape
    assert digit_uniform(parse.WRAPPER_RE) and digit_uniform(parse.VLLM_RE) and digit_uniform(parse.RAY_DEDUP_RE)


def test_wrapper_pattern_is_bounded_on_long_lines():
    import time
    for raw in ("a" * 1_000_000, "[" + "a" * 1_000_000, "a-" * 500_000 + "/", " " * 1_000_000, "(pid=" + "1" * 1_000_000,
                "x [repeated 3x across cluster]" * 30_000, "[pod/" + "a" * 1_000_000):
        t = time.perf_counter()
        parse_line(1, raw)
        assert time.perf_counter() - t < 0.5, raw[:20]


JOURNALD = LOGS / "vllm-0.25.1-h200-journald"


@pytest.mark.parametrize("name", sorted(p.name for p in JOURNALD.glob("*.log")))
def test_a_real_log_read_back_from_journald_is_diagnosed_as_the_log(name):
    # real journalctl (systemd 252) output of the real H200 logs (the folder's ORIGIN.md): every -o short form
    orig = LOGS / "vllm-0.25.1-h200" / (name.split(".")[0] + ".log")
    want, got = diagnose_file(orig, RULES), diagnose_file(JOURNALD / name, RULES)
    assert got.engine == "vllm" and got.engine_version == "0.25.1"
    assert_reads_as(got, want)


def _cri(lines: list[str]) -> list[str]:
    """containerd's CRI log file of ``lines`` with a 1,024-byte max_container_log_line_size, stdout and stderr
    interleaved (an empty record of the other stream between two pieces of some lines)."""
    out = []
    for i, ln in enumerate(lines):
        stream = "stderr" if i % 7 == 3 else "stdout"
        while len(ln) > 1024:
            out.append(f"2026-12-02T01:10:00.{i:09d}Z {stream} P {ln[:1024]}")
            ln = ln[1024:]
            if i % 5 == 0:      # the other stream's record between two pieces
                out.append(f"2026-12-02T01:10:00.{i:09d}Z {'stdout' if stream == 'stderr' else 'stderr'} F ")
        out.append(f"2026-12-02T01:10:00.{i:09d}Z {stream} F {ln}")
    assert any(" P " in o[:40] for o in out)
    return out


@pytest.mark.parametrize("log", ["F1b_fail", "A_fail", "D_fail"])
def test_a_cri_log_files_partial_records_are_joined(tmp_path, log):
    # containerd writes a line longer than max_container_log_line_size as "P" records and a last "F" one
    # (internal/cri/io/logger.go); the real H200 log rendered so reads as the log itself (vLLM's config line,
    # ~4 KiB, carries the resolved settings)
    got, _ = assert_render_reads_as(tmp_path, log, _cri, RULES)
    assert any("CRI partial records joined" in n for n in got.notes)


_VLLM_LINE = re.compile(r"^(\((?:EngineCore|APIServer|VllmWorker|Worker)[^)]{0,60}\) )?(INFO|WARNING|ERROR|DEBUG) "
                        r"(\d\d-\d\d \d\d:\d\d:\d\d) (\[[\w./-]+:\d+\]) ")


def _coloured(line: str, esc: str) -> str:
    """vLLM 0.25.1's colours on a terminal: the process prefix in CYAN ... RESET (utils/system_utils.py:27-28, :211),
    the level, time and file (logging_utils/formatter.py ColoredFormatter: level colour, GREY 90 for the rest)."""
    m = _VLLM_LINE.match(line)
    if not m:
        return line
    level = {"INFO": "32", "WARNING": "33", "ERROR": "31", "DEBUG": "37"}[m.group(2)]
    proc = f"{esc}[0;36m{m.group(1)[:-1]}{esc}[0;0m " if m.group(1) else ""
    return (f"{proc}{esc}[{level}m{m.group(2)}{esc}[0m {esc}[90m{m.group(3)}{esc}[0m {esc}[90m{m.group(4)}{esc}[0m "
            + line[m.end():])


@pytest.mark.parametrize("log", ["A_fail", "F1b_fail", "D_fail"])
@pytest.mark.parametrize("esc", ["\x1b", ""])
def test_vllms_terminal_colours_with_or_without_their_esc_byte_read_as_the_log(tmp_path, log, esc):
    # a terminal's capture keeps the ESC bytes; a copy out of a browser or a web console drops them and leaves
    # "[0;36m(EngineCore pid=1)[0;0m [32mINFO[0m ..." (a committed real log of held-out set 14 has that shape)
    def render(lines: list[str]) -> list[str]:
        out = [_coloured(ln, esc) for ln in lines]
        assert sum(1 for ln in out if "[0;36m(" in ln) > 5
        return out

    got, want = assert_render_reads_as(tmp_path, log, render, RULES)
    assert want.root is None or got.root.line.process == want.root.line.process != ""
