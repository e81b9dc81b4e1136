"""Compare two start-ups of the same model row by row — the proven one and the failing one — instead of
trusting a comment.

``compare(proven_log, failing_log)`` diagnoses both logs and lines up:

- settings: window, max_num_seqs, max_num_batched_tokens, kv_cache_dtype, gpu_memory_utilization, the pinned
  kv_cache_memory_bytes, TP/PP, cpu offload, enforce_eager, quantization, dtype — from the explicit args line
  (``non-default args``) and the resolved config line (:func:`oomdoctor.card.workload.from_log`); a setting on
  neither line is a default (its value is shown only where the engine version's default is known);
- the ledger: free memory before the start, weights, activation peak and non-torch memory (where printed),
  CUDA graph memory, KV available / the pinned arena, KV tokens, KV bytes per token (derived), max
  concurrency, engine init seconds — from the diagnoses' numbers;

then says what changed, by how much, and which setting change the memory arithmetic says explains each
ledger difference (with the predicted and the measured figure). Two logs of different engine versions get a
warning and only the version-stable rows are compared.

Modules: ``tables`` (the rows), ``read`` (one start), ``explain`` and ``failure`` (the arithmetic per cause),
``core`` (the line-up and the verdict), ``fmt`` and ``render`` (output).
"""
from oomdoctor.analysis.compare.core import compare
from oomdoctor.analysis.compare.explain import explain
from oomdoctor.analysis.compare.failure import explain_failure
from oomdoctor.analysis.compare.fmt import fmt_delta, fmt_value
from oomdoctor.analysis.compare.read import read_start
from oomdoctor.analysis.compare.render import plot, print_tables
from oomdoctor.analysis.compare.tables import KNOWN_DEFAULTS, LEDGER, SETTINGS

__all__ = ["KNOWN_DEFAULTS", "LEDGER", "SETTINGS", "compare", "explain", "explain_failure", "fmt_delta", "fmt_value",
           "plot", "print_tables", "read_start"]
