"""A lever's prediction from the start to the end: the memory model runs the card's settings with the lever's change,
and when the start would still fail, names the failure that comes next and the lever for it, until the start fits
(at most ``MAX_STEPS`` levers). "gpu_memory_utilization 0.27 passes the start-up check; then kv_capacity: one
request of 4000000 tokens needs 244.14 GiB KV, 33.68 GiB available → max_model_len 535,312; then the start fits".

It needs the model's config.json (``diagnose --model DIR`` keeps its folder in ``card.model_check.model``, or the
workload's model path on this machine); without it the chain is the lever's own prediction alone.
``check_chain`` compares a real run with the chain's first follow-up: ``confirmed`` or ``not_confirmed``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from oomdoctor.card.records import CardDict, Lever
from oomdoctor.engines.vllm.memory.prediction import same_step
from oomdoctor.errors import BadInput
from oomdoctor.levers.modelcheck import PLAN_ARGS, _device, _settings
from oomdoctor.units import human_bytes

MAX_STEPS = 3
OWN_WORDS = {"fits": "fits", "passes_startup_check": "passes the start-up check", "short": "falls short",
             "unknown": "has no prediction of its own"}


def model_dir(card: Mapping[str, Any]) -> str | None:
    """The model folder the memory model can read: the one ``diagnose --model`` used, else the workload's model."""
    for cand in ((card.get("model_check") or {}).get("model"), (card.get("workload") or {}).get("model")):
        if cand and (Path(str(cand)) / "config.json").is_file():
            return str(cand)
    return None


def _value(change: Mapping[str, Any], lever_id: str = "") -> str:
    """``max_model_len ≤ 535,312`` / ``gpu_memory_utilization 0.27``: a lever's change in a few words."""
    if lever_id in ("free_other_processes", "larger_gpu", "none"):
        return lever_id
    rel = " ≤ " if lever_id == "max_model_len" else " "
    return ", ".join(f"{k}{rel}{v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k} {v}"
                     for k, v in change.items())


def _model_change(lever_id: str, change: Mapping[str, Any]) -> dict[str, Any] | None:
    """The lever as memory-model inputs; None when the model cannot express it."""
    if lever_id == "free_other_processes":
        return {"free": None}
    if lever_id == "none":
        return {}
    if change and set(change) <= set(PLAN_ARGS):
        return dict(change)
    return None


def _run(model: str, card: CardDict, inputs: dict[str, Any]) -> dict[str, Any]:
    from oomdoctor.levers.plan import plan

    total, free = _device(card, None)
    if total is None:
        raise BadInput("the GPU's total memory is not in the card")
    free = inputs.pop("free", free)
    ctx = "llm" if (card.get("workload") or {}).get("launcher") == "vllm-llm" else "serve"
    return plan(model, total, free=free, engine_version=(card.get("engine") or {}).get("version"), usage_context=ctx,
                **inputs)


def _fits_text(r: Mapping[str, Any]) -> str:
    text = (f"then the start fits: {r.get('kv_tokens') or 0:,} tokens of KV cache for a "
            f"{r.get('max_model_len') or 0:,}-token window")
    warm = r.get("warmup") or {}
    if warm.get("at_the_edge"):      # a pinned arena's warm-up with less to spare than the allocator has been seen to lose
        text += (f" (the warm-up of {warm['requests']:,} dummy requests after the pinned arena has "
                 f"{human_bytes(warm['headroom_bytes'])} to spare: the allocator's fragmentation, up to 173 MiB on "
                 "the H200 walks, decides; if it runs out, max_num_seqs)")
    return text


def expected_chain(card: CardDict, lever: Lever, base: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The chain this lever is expected to start: ``{"steps": [...], "text": "...", "model": DIR | None}``.
    Each step is the lever's own check, a predicted failure (``failure``, ``reason``) or the next lever."""
    own = (lever.get("predicted") or {}).get("outcome", "unknown")
    first = f"{_value(lever.get('change') or {}, lever['id']) or lever['id']} {OWN_WORDS.get(own, own)}"
    steps: list[dict[str, Any]] = [{"lever": lever["id"], "change": lever.get("change") or {}, "text": first}]
    model = model_dir(card)
    out: dict[str, Any] = {"steps": steps, "model": model}
    inputs = _settings(card)
    for b in (base or []) + [{"lever": lever["id"], "change": lever.get("change") or {}}]:
        mc = _model_change(b["lever"], b["change"])
        if mc is None:
            model = None
            break
        inputs.update(mc)
    if model is None:
        out["text"] = first + " (no model config to predict what comes next)"
        return out
    try:
        _walk(model, card, inputs, steps)
    except (BadInput, ValueError, KeyError, TypeError, ZeroDivisionError) as e:   # a prediction never stops a retest
        steps.append({"text": f"the memory model cannot say what comes next ({type(e).__name__}: {e})"[:300]})
    if (card.get("classification") or {}).get("phase") == "runtime":
        # the model predicts the start-up steps; a failure while serving is past all of them, so "the start fits"
        # says nothing of it (a real walk, S1 of incidents/h200-retest-2026-12-02-dawn/, had its chain "not
        # confirmed" by the runtime OOM it was never about)
        out["startup_only"] = True
        steps.append({"text": "(the memory model predicts the start, not the serving peak this failure had)"})
    out["text"] = chain_text(steps)
    return out


def chain_text(steps: list[dict[str, Any]]) -> str:
    text = steps[0]["text"] if steps else ""
    for s in steps[1:]:
        text += (" " if s.get("lever") else "; ") + s["text"]
    return text


def _walk(model: str, card: CardDict, inputs: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    for _ in range(MAX_STEPS):
        r = _run(model, card, dict(inputs))
        if r["fits"]:
            steps.append({"predicted": "fits", "text": _fits_text(r)})
            return
        fail = r.get("failure") or {}
        steps.append({"failure": fail.get("class"), "reason": fail.get("reason"),
                      "text": f"then {fail.get('class')}: {fail.get('reason')}"})
        nxt = next((lv for lv in r.get("levers") or [] if _model_change(lv["id"], lv["change"]) is not None
                    and lv["id"] not in ("larger_gpu", "tensor_parallel_size")), None)
        if nxt is None:
            steps.append({"text": "no single setting on this GPU makes it fit"})
            return
        steps.append({"lever": nxt["id"], "change": nxt["change"], "text": f"→ {_value(nxt['change'], nxt['id'])}"})
        inputs.update(_model_change(nxt["id"], nxt["change"]) or {})
        if nxt["id"] == "free_other_processes":
            inputs["free"] = None


def first_follow_up(chain: Mapping[str, Any]) -> str | None:
    """The class the chain expects next after the lever ('fits' when it expects the start to fit); None: no prediction."""
    for s in (chain.get("steps") or [])[1:]:
        if s.get("predicted") == "fits":
            return "fits"
        if s.get("failure"):
            return str(s["failure"])
    return None


def chain_next_step(chain: Mapping[str, Any]) -> dict[str, Any] | None:
    """The step the chain plans after its first follow-up failure (``→ gpu_memory_utilization 0.97``: its ``lever``,
    its ``change``, and ``then_fits`` when the chain's next step after it is the start fitting); None: none."""
    steps = list(chain.get("steps") or [])
    seen_failure = False
    for i, s in enumerate(steps[1:], 1):
        if s.get("failure"):
            seen_failure = True
        elif seen_failure and s.get("lever"):
            after = steps[i + 1] if i + 1 < len(steps) else {}
            return {"lever": str(s["lever"]), "change": dict(s.get("change") or {}),
                    "then_fits": after.get("predicted") == "fits"}
        elif s.get("predicted") == "fits":
            return None
    return None


def check_chain(chain: Mapping[str, Any] | None, outcome: str, new_class: str | None) -> dict[str, Any] | None:
    """Did the run confirm the chain's first follow-up? None when the chain predicted nothing after the lever."""
    expected = first_follow_up(chain or {})
    if expected is None or outcome == "inconclusive" or ((chain or {}).get("startup_only") and expected == "fits"):
        return None
    observed = "fits" if outcome in ("pass", "regressed") else new_class
    return {"expected": expected, "observed": observed,
            "status": "confirmed" if observed == expected or same_step(expected, observed) else "not_confirmed"}
