"""A bare "CUDA out of memory" is read whatever punctuation follows it — a comma, or the full-width question mark of a
Chinese report's heading ("为什么vllm初始化的时候会torch.OutOfMemoryError: CUDA out of memory？", held-out set 6) — and
not inside a longer word. The same boundary in vLLM's, SGLang's, TGI's and LMDeploy's rules."""
from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules

RULES = default_rules()


@pytest.mark.parametrize("text", ["为什么vllm初始化的时候会torch.OutOfMemoryError: CUDA out of memory？",
                                  "RuntimeError: CUDA out of memory, retrying with a smaller batch",
                                  "RuntimeError: CUDA out of memory."])
def test_the_bare_message_is_an_oom(tmp_path: Path, text: str):
    p = tmp_path / "paste.log"
    p.write_text(text + "\n", encoding="utf-8")
    d = diagnose_file(p, RULES)
    assert d.is_memory_failure and d.rule.endswith("cuda_oom.torch"), (d.klass, d.rule)


@pytest.mark.parametrize("text", ["INFO: test_CUDA out of memoryless allocator passed", "CUDA out of memory-mapped file"])
def test_a_longer_word_is_not(tmp_path: Path, text: str):
    p = tmp_path / "paste.log"
    p.write_text(text + "\n", encoding="utf-8")
    assert not diagnose_file(p, RULES).is_memory_failure


def test_an_indented_exception_line_is_a_failure_that_is_not_memory(tmp_path: Path):
    # a stack dump that prints its frames and the exception indented (held-out set 17: SGLang's EAGLE worker,
    # "  spec_utils.py:713 detect_nan" then "  ValueError: Detected errors during sampling! NaN in the logits.")
    p = tmp_path / "paste.log"
    p.write_text("  eagle_worker_v2.py:765 verify\n  spec_utils.py:713 detect_nan\n"
                 "  ValueError: Detected errors during sampling! NaN in the logits.\n", encoding="utf-8")
    d = diagnose_file(p, RULES)
    assert d.klass == "not_memory" and not d.is_memory_failure
