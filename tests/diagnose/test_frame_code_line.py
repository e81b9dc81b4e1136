"""A traceback cut below its innermost frame: that frame's own source line names the call it was making
(rules.frame_patterns: an indented statement that calls a frame rule's function). Slices of a real served log,
fixtures/logs/vllm-0.25.1-h200-morning/W1_serve_warmup.log (the V2 runner's warm-up ran out)."""
from __future__ import annotations

import re
from pathlib import Path

from oomdoctor.diagnose.rules import frame_patterns
from oomdoctor.diagnose.classify import diagnose_file
from oomdoctor.diagnose.rules import default_rules

LOG = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "vllm-0.25.1-h200-morning" / "W1_serve_warmup.log"
LINES = LOG.read_text(encoding="utf-8").splitlines()
RULES = default_rules()


def _read(tmp_path: Path, lines: list[str]) -> tuple[str, str, str]:
    p = tmp_path / "paste.log"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    d = diagnose_file(p, RULES)
    return d.klass, d.phase, d.confidence


def _at(text: str) -> int:
    return next(i for i, t in enumerate(LINES) if text in t)


def test_a_code_line_calling_a_frame_function_is_that_frame():
    pats = [re.compile(p["regex"]) for p in frame_patterns(["warmup_kernels"], "t")]
    hits = ["    warmup_kernels(self.model_runner, self.execute_model, self.sample_tokens)",
            "    out = warmup_kernels(runner)", "    return self.worker.warmup_kernels(",
            "    compilation_times: list[CompilationTimes] = mod.warmup_kernels("]
    misses = ["warmup_kernels(self.model_runner)",            # not indented: prose, not a frame's line
              "    my_warmup_kernels(x)", "    print('warmup_kernels(')", '  File "w.py", line 3, in other']
    assert all(any(p.search(h) for p in pats) for h in hits)
    assert not any(p.search(m) for p in pats for m in misses)


def test_the_engine_core_traceback_cut_below_compile_or_warm_up_model_reads_as_the_warm_up(tmp_path):
    # the root line, then the engine core's own second print of the traceback, cut right after the worker's
    # compile_or_warm_up_model frame and its line 'warmup_kernels(...)'
    root = _at("torch.OutOfMemoryError: CUDA out of memory")
    end = _at("Process EngineCore:")
    second = next(i for i in range(end, len(LINES)) if LINES[i].endswith("warmup_kernels(self.model_runner, "
                                                                          "self.execute_model, self.sample_tokens)"))
    cut = LINES[root - 30:second + 1]
    assert _read(tmp_path, cut)[:2] == ("sampler_warmup_oom", "warmup")
    # without the code line the same cut has only compile_or_warm_up_model: capture, said with medium confidence
    assert _read(tmp_path, cut[:-1]) == ("cuda_graph_oom", "cuda_graph", "medium")
