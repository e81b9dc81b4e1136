"""An exception line without a message (held-out set 4's miss, issue 12): CPython's traceback ends with the class's
module-qualified name alone when ``str(exc)`` is empty (Lib/traceback.py, format_exception_only): ``bdb.BdbQuit``,
``asyncio.exceptions.CancelledError``. Each Python engine's exception rule reads it (not_memory, a fallback); a bare
word, a module or a path alone on a line is not one, and a bare torch OutOfMemoryError is not called not_memory."""
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
    "asyncio.exceptions.CancelledError",
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
])
def test_a_bare_word_a_path_or_a_sentence_is_not(rule_id, text):
    assert not _matches(rule_id, text), f"{rule_id} reads {text!r}"
