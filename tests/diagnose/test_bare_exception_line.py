"""An exception line without a message (held-out set 4's miss, issue 12): CPython's traceback ends with the class's
module-qualified name alone when ``str(exc)`` is empty (Lib/traceback.py, format_exception_only): ``bdb.BdbQuit``,
``concurrent.futures._base.TimeoutError``. Each Python engine's exception rule reads it (not_memory, a fallback); a bare
word, a module or a path alone on a line is not one, a bare torch OutOfMemoryError is not called not_memory, and
asyncio's CancelledError is no failure of its own (a task cancelled because its server stopped: set 7's stopped
``vllm serve`` had been called a not_memory failure)."""
from __future__ import annotations

import pytest

from oomdoctor.diagnose.rules import default_rules
from oomdoctor.diagnose.parse import parse_line

RULES = default_rules()
EXCEPTION_RULES = ["vllm.other.exception", "sglang.other.exception", "tgi.other.exception"]


def _matches(rule_id: str, text: str) -> bool:
    rule = RULES.by_id(rule_id)
    line = parse_line(1, text)
    return any(p.anchor in line.text for p in rule.patterns) and rule.match(line) is not None


@pytest.mark.parametrize("rule_id", EXCEPTION_RULES)
@pytest.mark.parametrize("text", [
    "bdb.BdbQuit",
    "concurrent.futures._base.TimeoutError",
    "zmq.error.ZMQError",
    "requests.exceptions.ConnectionError  ",
    "websockets.exceptions.ConnectionClosedException",
])
def test_a_module_qualified_class_alone_is_an_exception_line(rule_id, text):
    assert _matches(rule_id, text), f"{rule_id} does not read {text!r}"


@pytest.mark.parametrize("rule_id", EXCEPTION_RULES)
@pytest.mark.parametrize("text", [
    "CancelledError",                                     # a bare word (a builtin prints no module)
    "KeyboardInterrupt",
    "BdbQuit",
    "asyncio.exceptions",                                 # a module, not a class
    "/usr/lib/python3.11/asyncio/exceptions.py",          # a path
    "vllm/v1/engine/exceptions/EngineError",
    "torch.OutOfMemoryError",                             # a memory error is the memory rules' to read
    "torch.cuda.OutOfMemoryError",
    "bdb.BdbQuit was raised",                             # not alone on the line
    "see asyncio.exceptions.CancelledError",
    "asyncio.exceptions.CancelledError",                  # a cancellation follows what stopped the task: no root
])
def test_a_bare_word_a_path_or_a_sentence_is_not(rule_id, text):
    assert not _matches(rule_id, text), f"{rule_id} reads {text!r}"


def test_a_server_stopped_by_its_user_is_no_failure(tmp_path):
    from oomdoctor.diagnose.classify import diagnose_file
    p = tmp_path / "stopped.log"
    p.write_text("INFO:     Shutting down\n"
                 "ERROR:    Traceback (most recent call last):\n"
                 '  File "/usr/local/lib/python3.11/dist-packages/starlette/routing.py", line 701, in lifespan\n'
                 "    await receive()\n"
                 '  File "/usr/lib/python3.11/asyncio/queues.py", line 158, in get\n'
                 "    await getter\n"
                 "asyncio.exceptions.CancelledError\n", encoding="utf-8")
    d = diagnose_file(p, RULES)
    assert d.klass == "unknown" and d.root is None and not d.is_memory_failure
