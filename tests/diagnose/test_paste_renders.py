"""Stage 1b, paste: what a renderer added to a pasted log (quote markers, a shared indentation, HTML escapes and
tags, non-breaking spaces, hard wraps at a terminal's width) is undone before the log is read, and only then.

The field-guide fixtures are the paste shapes the field guide describes; each is put through what a reply, a
Markdown list, a saved HTML page or a terminal copy does to it, and must read as it did before."""
from __future__ import annotations

import gzip
import hashlib
import html
import json
from pathlib import Path

import pytest
import yaml

from oomdoctor.diagnose import paste
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.paste import undo
from oomdoctor.diagnose.parse import parse_line
from oomdoctor.diagnose.rules import default_rules

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "logs"
FG = FIX / "field-guide"
CASES = yaml.safe_load((FG / "expected.yaml").read_text(encoding="utf-8"))
RULES = default_rules()


def _lines(t: str) -> list[str]:
    return t.split("\n")


RENDERS = {
    "reply quote": lambda t: "\n".join("> " + ln for ln in _lines(t)),
    "nested quote": lambda t: "\n".join("> > " + ln if ln else ">>" for ln in _lines(t)),
    "markdown indent": lambda t: "\n".join("    " + ln for ln in _lines(t)),
    "list-item tab": lambda t: "\n".join("\t" + ln if ln else "" for ln in _lines(t)),
    "html escapes": lambda t: html.escape(t),
    "html page": lambda t: "<pre><code>" + html.escape(t) + "</code></pre>\n",
    "nbsp blanks": lambda t: t.replace(" ", "\u00a0"),
    "cat -n": lambda t: "\n".join(f"{i:>6}\t{ln}" for i, ln in enumerate(_lines(t.rstrip("\n")), 1)) + "\n",
    "docker json-file": lambda t: "".join(json.dumps({"log": ln + "\n", "stream": "stderr",
                                                      "time": "2026-03-04T18:02:11.408123456Z"}) + "\n"
                                          for ln in _lines(t.rstrip("\n"))),
}


def wrap(t: str, width: int) -> str:
    out = []
    for ln in _lines(t):
        while len(ln) > width:
            out.append(ln[:width])
            ln = ln[width:]
        out.append(ln)
    return "\n".join(out)


def _read(text: str, tmp_path: Path, name: str = "paste.log"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return diagnose_file(p, RULES)


def _own(case) -> tuple[str, str, str | None]:
    d = diagnose_file(FG / case["file"], RULES)
    return d.klass, d.phase, d.engine


def _untouched(text: str) -> bool:
    """A fixture that holds no renderer's trace itself (three do: a wrapped one, an HTML one, a wrapped logfmt one)."""
    return not undo(text.encode())[1]


# one paste of each shape (a V1 worker traceback, a V0 traceback, llama-server lines, TensorRT-LLM's, LMDeploy's)
# (not oe-016: one message repeated six times wraps into six identical lines, which no reader tells from a record
# repeated before lines of its own)
SOME = [c for c in CASES if c["id"] in ("vllm-v1-002", "vllm-v1-021", "vllm-v0p-007", "vllm-v0p-027", "oe-017",
                                        "oe-044", "oe-046", "oe-051")]
# wrapped so that no reader can join it back: the V0 worker prefix is exactly 80 wide (every break falls before a
# frame's own indentation), and the SYCL device table of oe-033 cut at 120 loses the build path that names Ollama
WRAP_LIMITS = {("vllm-v0p-010", 80), ("oe-033", 120)}


@pytest.mark.parametrize("render", sorted(RENDERS))
def test_every_field_guide_paste_reads_the_same_through_each_render(render, tmp_path):
    changed = []
    for case in CASES:
        text = (FG / case["file"]).read_text(encoding="utf-8")
        if not _untouched(text):
            continue
        own = _own(case)
        rendered = RENDERS[render](text)
        d = _read(rendered, tmp_path)
        if (d.klass, d.phase, d.engine) != own:
            changed.append((case["id"], own, (d.klass, d.phase, d.engine)))
        elif undo(rendered.encode())[1]:           # (one indented line alone keeps its indentation)
            assert any(n.startswith("read as a pasted log") for n in d.notes), case["id"]
    assert not changed


@pytest.mark.parametrize("render", sorted(RENDERS))
def test_a_render_is_undone_exactly(render):
    for case in CASES:
        text = (FG / case["file"]).read_text(encoding="utf-8")
        if not _untouched(text) or not text.strip():
            continue
        body = [ln for ln in _lines(text) if ln.strip()]
        if render in ("markdown indent", "list-item tab", "cat -n") and (
                len(body) < 2 or all(ln[:1] in (" ", "\t") for ln in body) and render != "cat -n"):
            continue        # one line keeps its indentation; a paste indented already loses its own margin too
        got, undone = undo(RENDERS[render](text).encode())
        want = text if render != "html page" else text + "\n"
        if render in ("cat -n", "docker json-file"):
            want = text.rstrip("\n") + ("\n" if render == "cat -n" else "")
        assert got.decode() == want, (case["id"], undone)


@pytest.mark.parametrize("width", [80, 100, 120])
@pytest.mark.parametrize("case", SOME, ids=[c["id"] for c in SOME])
def test_a_paste_wrapped_at_a_terminal_width_is_joined_back(case, width, tmp_path):
    text = (FG / case["file"]).read_text(encoding="utf-8")
    wrapped = wrap(text, width)
    got, undone = undo(wrapped.encode())
    assert got.decode() == text and undone == [
        f"lines hard-wrapped at {width} characters joined (line numbers count the joined lines: the paste's "
        f"{len(_lines(wrapped))} are {len(_lines(text))})"]
    d = _read(wrapped, tmp_path)
    assert (d.klass, d.phase, d.engine) == _own(case)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_every_wrapped_field_guide_paste_reads_the_same(width, tmp_path):
    changed, whole, long = [], 0, 0
    for case in CASES:
        text = (FG / case["file"]).read_text(encoding="utf-8")
        wide = [ln for ln in _lines(text) if len(ln) > width]
        if not _untouched(text) or len(wide) < 3:        # one wrapped line alone is not told from two lines
            continue
        wrapped = wrap(text, width)
        got = set(_lines(undo(wrapped.encode())[0].decode()))
        whole += sum(ln in got for ln in wide)
        long += len(wide)
        d = _read(wrapped, tmp_path)
        if (d.klass, d.phase, d.engine) != _own(case) and (case["id"], width) not in WRAP_LIMITS:
            changed.append(case["id"])
    assert not changed
    # a break before a line's own indentation, or before what starts a record, is not joined (it cannot be told
    # from a line of its own): most long lines still come back whole
    assert whole >= 0.8 * long, (whole, long)


def test_the_field_guides_wrapped_paste_reads_its_frames_whole():
    # vllm-v0p-019: a terminal copy wrapped at 80 columns ("vllm/engine/multip" / "rocessing/engine.py")
    d = diagnose_file(FG / "vllm-v0p-019.log", RULES)
    assert (d.klass, d.phase) == ("kv_allocation_oom", "kv_reservation")
    assert any("hard-wrapped at 80" in n for n in d.notes)
    got = undo((FG / "vllm-v0p-019.log").read_bytes())[0].decode()
    assert 'site-packages/vllm/engine/multiprocessing/engine.py", line 390, in run_mp_engine' in got


def test_a_wrap_that_dropped_the_blank_before_a_logfmt_field_gets_it_back():
    got = undo((FG / "oe-032.log").read_bytes())[0].decode()
    assert "layers.offload=44 layers.split=11,11,11,11" in got


@pytest.mark.parametrize("name,why", [
    ("field-guide/oe-017.log", "llama-server timing records of one width, each its own record"),
    ("field-guide/oe-033.log", "a SYCL device table: rows of one width"),
    ("neuron-runtime-quoted/hbm_alloc_failed.log", "a memory-usage table"),
    ("llamacpp-0c1e57098-formatstrings/compute_buffer_oom.log", "llama-server's 'srv    load_model: ' records"),
    ("field-guide/vllm-v1-034.log", "one line: its indentation is pydantic's own"),
])
def test_what_is_no_render_is_left_as_it_is(name, why):
    data = (FIX / name).read_bytes()
    assert undo(data) == (data, []), why


@pytest.mark.parametrize("case, width", [("oe-041", 120), ("vllm-v0p-016", 120), ("oe-018", 120), ("oe-041", 80)])
def test_a_short_paste_that_ends_in_one_wrapped_line_is_joined_back(case, width, tmp_path):
    # a 1- to 6-line paste whose last message a terminal of a usual width broke once: one break is enough there
    # (in a longer paste a line of any one length occurs by chance: two different breaks are needed)
    text = (FG / f"{case}.log").read_text(encoding="utf-8")
    wrapped = wrap(text, width)
    assert len(_lines(wrapped)) > len(_lines(text))
    got, undone = undo(wrapped.encode())
    assert got.decode() == text and undone and f"hard-wrapped at {width}" in undone[0]
    c = next(c for c in CASES if c["id"] == case)
    assert (_read(wrapped, tmp_path).klass, _read(text, tmp_path).klass) == (c["class"], c["class"])


def test_one_line_of_a_usual_width_is_no_wrap_before_a_line_that_does_not_end_the_paste():
    line = "x" * 119 + "e"
    assert undo(f"{line}\npulling manifest\nError: pull model manifest: file does not exist\n".encode())[1] == []
    # nor a break between a word and a path, nor in a longer paste
    assert undo(f"{'y' * 119}d\n/src/ggml-backend.cpp:125: GGML_ASSERT(base != NULL) failed\n".encode())[1] == []
    assert undo(("short line\n" * 20 + f"{line}\nmore text\n").encode())[1] == []


def test_a_record_repeated_between_every_line_is_no_wrap():
    # a noisy rank's line of one width between every line of a log (tests/commands' interleaving check)
    noise = "(Worker_TP1 pid=9) INFO 11-29 15:05:31 [custom_all_reduce.py:203] Registering 4563 cuda graph addresses"
    text = (FIX / "vllm-0.25.1-h200" / "A_fail.log").read_text(encoding="utf-8")
    mixed = "".join(ln + "\n" + noise + "\n" for ln in text.rstrip("\n").split("\n"))
    assert undo(mixed.encode())[1] == []


def test_no_log_of_the_project_but_four_pastes_is_rewritten():
    # vllm-v1-011: its docker compose lines keep vLLM's coloured prefix without the ESC bytes ("[1;36m(VllmWorker ...")
    touched = sorted(str(p.relative_to(FIX)) for p in FIX.rglob("*.log")
                     if p.stat().st_size <= paste.PASTE_MAX_BYTES and undo(p.read_bytes())[1])
    assert touched == ["field-guide/oe-032.log", "field-guide/vllm-v0p-019.log", "field-guide/vllm-v1-011.log",
                       "field-guide/vllm-v1-027.log"]
    assert undo((FIX / "field-guide" / "vllm-v1-011.log").read_bytes())[1] == [
        "colour codes without their ESC byte removed (58 lines started with one)"]


def test_frames_only_paste_keeps_python_indentation():
    text = ('    File "/x/vllm/v1/worker/gpu_model_runner.py", line 1, in profile_run\n'
            '      self._dummy_run()\n'
            '    File "/x/vllm/v1/worker/gpu_model_runner.py", line 2, in _dummy_run\n'
            '      out = self.model()\n')
    got, undone = undo(text.encode())
    assert got.decode().splitlines()[0] == '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1, in profile_run'
    assert undone == ["an indentation of 2 shared by every line removed"]


def test_a_python_prompt_is_no_quote_marker():
    text = (">>> import torch\n>>> torch.cuda.mem_get_info()\n(11332632576, 12168992768)\n"
            ">>> torch.zeros(1, device='cuda')\n")
    assert undo(text.encode()) == (text.encode(), [])


def test_a_mostly_quoted_reply_keeps_its_own_words_and_loses_the_markers():
    text = ("I get this:\n> ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine.\n> \n> it happens every time\n")
    got, undone = undo(text.encode())
    assert got.decode().splitlines()[1].startswith("ValueError: No available memory")
    assert got.decode().splitlines()[0] == "I get this:" and undone == ["'>' quote markers removed"]


def test_the_card_keeps_the_pasted_files_own_hash_size_and_name(tmp_path):
    text = (FG / "vllm-v1-010.log").read_text(encoding="utf-8")
    quoted = RENDERS["reply quote"](text).encode()
    p = tmp_path / "reply.txt"
    p.write_bytes(quoted)
    d = diagnose_file(p, RULES)
    assert d.source.path == str(p)
    assert d.source.sha256 == hashlib.sha256(quoted).hexdigest() and d.source.size_bytes == len(quoted)
    assert d.source.undone == ["'>' quote markers removed"]
    assert (d.klass, d.phase, d.engine) == _own(next(c for c in CASES if c["id"] == "vllm-v1-010"))


def test_large_or_compressed_logs_are_read_as_they_are(tmp_path, monkeypatch):
    quoted = RENDERS["reply quote"]((FG / "vllm-v1-010.log").read_text(encoding="utf-8")).encode()
    gz = tmp_path / "q.log.gz"
    gz.write_bytes(gzip.compress(quoted))
    with paste.readable(gz) as got:
        assert got.path == gz and got.undone == []
    monkeypatch.setattr(paste, "PASTE_MAX_BYTES", len(quoted) - 1)
    big = tmp_path / "q.log"
    big.write_bytes(quoted)
    with paste.readable(big) as got:
        assert got.path == big and got.undone == []


def test_the_private_copy_is_gone_after_reading(tmp_path):
    p = tmp_path / "q.log"
    p.write_text(RENDERS["reply quote"]("RuntimeError: CUDA out of memory.\nsecond line\n"), encoding="utf-8")
    with paste.readable(p) as got:
        copy = got.path
        assert copy != p and copy.read_text().startswith("RuntimeError: CUDA out of memory.")
    assert not copy.exists()


def test_a_docker_time_stamp_before_vllms_own_header_leaves_the_header_to_vllm():
    ln = parse_line(1, "2026-03-04T18:02:11.408123456Z WARNING 11-27 09:14:33 scheduler.py:1483] Sequence group 0 "
                       "is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space.")
    assert (ln.level, ln.ts, ln.src) == ("WARNING", "11-27 09:14:33", "scheduler.py:1483")
    assert ln.msg.startswith("Sequence group 0 is preempted")
    # a collector's own level word stays the collector's
    ln = parse_line(2, "2026-03-04 18:02:11.408 [Error] (Process) (EngineCore pid=4) ERROR 03-04 18:02:11 "
                       "[core.py:1] x")
    assert (ln.proc, ln.level, ln.msg) == ("EngineCore", "ERROR", "x")


def test_field_guide_paste_behind_docker_time_stamps_reads_the_same(tmp_path):
    for cid in ("vllm-v0p-034", "vllm-v0p-027", "vllm-v1-025"):
        case = next(c for c in CASES if c["id"] == cid)
        text = (FG / case["file"]).read_text(encoding="utf-8")
        stamped = "\n".join("2026-03-04T18:02:11.408123456Z " + ln for ln in _lines(text))
        d = _read(stamped, tmp_path)
        assert (d.klass, d.phase, d.engine) == _own(case), cid


def test_a_docker_record_split_at_its_size_limit_is_one_line_again():
    # moby writes a long line in pieces: the pieces but the last have no newline at the end of their "log"
    records = [{"log": "RuntimeError: CUDA out of memory. Tried to ", "stream": "stderr", "time": "t"},
               {"log": "allocate 2.00 GiB.\n", "stream": "stderr", "time": "t"}]
    got, undone = undo("".join(json.dumps(r) + "\n" for r in records).encode())
    assert got.decode() == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert undone == ['Docker\'s json-file records read (2): their "log" text']


def test_json_lines_that_are_not_dockers_stay():
    text = '{"level": "info", "msg": "started"}\n{"level": "error", "msg": "CUDA out of memory"}\n'
    assert undo(text.encode()) == (text.encode(), [])


def test_numbers_that_do_not_count_up_are_the_logs_own():
    text = "3\tfirst\n9\tsecond\n4\tthird\n"
    assert undo(text.encode()) == (text.encode(), [])


def test_a_refused_paste_is_named_as_given_not_as_its_copy(tmp_path):
    from oomdoctor.errors import BadInput
    p = tmp_path / "reply.txt"
    p.write_bytes(b"".join(b"> " + bytes(range(1, 9)) * 8 + b"\n" for _ in range(50)))   # quoted, but control bytes
    with pytest.raises(BadInput) as e:
        diagnose_file(p, RULES)
    assert str(p) in str(e.value) and "paste.log" not in str(e.value)
