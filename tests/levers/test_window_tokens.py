"""vLLM's V0 error gives the tokens its KV cache holds and no bytes ("The model's max seq len (163840) is larger than
the maximum number of tokens that can be stored in KV cache (63040)"): the window lever is sized by those tokens. It
had offered gpu_memory_utilization 0.95, which a CPU backend has no use for (field guide vllm-v0p-016) and which
cannot close a 2.6x gap (vllm-v0p-014, whose thread's fix was a smaller --max-model-len)."""
from __future__ import annotations

from pathlib import Path

import pytest

from oomdoctor.card.incident import diagnose_log

FG = Path(__file__).resolve().parents[2] / "fixtures" / "logs" / "field-guide"


@pytest.mark.parametrize("case, mml, cap", [("vllm-v0p-014", 163840, 63040), ("vllm-v0p-016", 131072, 21840),
                                            ("vllm-v0p-013", 163840, 13360)])
def test_the_window_is_the_tokens_the_kv_cache_holds(tmp_path, case, mml, cap):
    card, _, _ = diagnose_log(FG / f"{case}.log", tmp_path / "c.yaml", no_device=True)
    assert card["numbers"]["max_model_len"] == mml and card["numbers"]["kv_capacity_tokens"] == cap
    lv = card["levers"][0]
    new = lv["change"]["max_model_len"]
    assert lv["id"] == "max_model_len" and cap * 0.9 < new <= cap * 0.98 and new % 16 == 0
    assert lv["predicted"]["outcome"] == "fits" and f"{cap:,} tokens" in lv["arithmetic"][0]
