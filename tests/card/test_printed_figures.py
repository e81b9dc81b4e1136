"""A byte number the log printed in a unit larger than a byte ("4.1 GiB") is rebuilt from its digits: the card says
so (``numbers_printed``), and the tables write it as printed with its bytes after "≈". A byte count the log printed
whole keeps its exact bytes."""
from __future__ import annotations

import io
from pathlib import Path

from oomdoctor.card.incident import diagnose_log
from oomdoctor.diagnose.report import contract_json, render

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "logs"


def _card(log: Path) -> dict:
    card, _, _ = diagnose_log(log, no_card=True, no_device=True)
    return dict(card)


def test_a_rounded_figure_is_kept_as_printed_and_its_bytes_marked_approximate() -> None:
    # G1: "reserved 4.1 GiB memory for KV Cache as specified by kv_cache_memory_bytes": the user set 4,400,000,000 B;
    # 4.1 GiB rebuilt is 4,402,341,478 B, which no one set
    card = _card(LOGS / "vllm-0.25.1-h200-morning" / "G1_serve_capture.log")
    printed = card["numbers_printed"]
    assert printed["kv_cache_memory_bytes"] == "4.1 GiB"
    assert card["numbers"]["kv_cache_memory_bytes"] != card["workload"]["engine_args"]["kv_cache_memory_bytes"]
    assert printed["gpu_free_bytes"] == "3.56 MiB" and printed["gpu_total_bytes"] == "139.80 GiB"
    assert not any(k in printed for k in ("max_model_len", "kv_cache_tokens", "other_process_pid"))
    out = io.StringIO()
    render(card, None, file=out, verbose=True, width=80)
    text = out.getvalue()
    assert "4.1 GiB (≈ 4,402,341,478 B)" in text and "139.80 GiB (≈ 150,109,106,995 B)" in text
    assert "│ 32,768 " in text                      # a count is no byte figure: as it was
    assert contract_json(card, None)["numbers_printed"] == printed


def test_a_byte_count_printed_whole_is_exact() -> None:
    # llama.cpp: "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9936.06 MiB on device 0: cudaMalloc failed"
    # then "failed to allocate CUDA0 buffer of size 10418714050": the MiB figure is rounded, the byte count is not
    card = _card(LOGS / "llamacpp-0c1e57098-formatstrings" / "compute_buffer_oom.log")
    assert card["numbers_printed"]["tried_to_allocate_bytes"] == "9936.06 MiB"
    assert "failed_buffer_bytes" not in card["numbers_printed"]
    out = io.StringIO()
    render(card, None, file=out, verbose=True, width=100)
    assert "(10,418,714,050 B)" in out.getvalue() and "9936.06 MiB (≈ 10,418,714,051 B)" in out.getvalue()
    # HAMi-core's quota line prints bytes: no card field for figures printed rounded
    assert "numbers_printed" not in _card(LOGS / "hami-core-formatstrings" / "device_quota_oom.log")
