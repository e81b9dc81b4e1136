"""What the ladder measures: the card's workload as retest would run it, and its fingerprints."""
from __future__ import annotations

from typing import Any

from oomdoctor import contract
from oomdoctor.card import store as cardmod
from oomdoctor.card.fingerprint import effective_config, fingerprint
from oomdoctor.card.records import CardDict, Lever
from oomdoctor.errors import BadInput

NONE_LEVER: Lever = {"id": "none", "change": {}, "rank": 0, "predicted": {}, "cost": "nothing: the workload as recorded"}


def workload_identity(card: CardDict, gpu_index: int = 0) -> dict:
    """What the ladder measures: the card's workload as ``retest`` would run it with no lever (the recorded
    launch + the changes of earlier attempts that fixed their failure). Raises BadInput for a card whose
    workload cannot be re-run."""
    from oomdoctor.retest.run import plan

    if not isinstance(card.get("workload"), dict) or not card["workload"]:
        raise BadInput("the card has no workload: nothing to start (record one with `oomdoctor record -- CMD ...`)")
    p = plan(card, NONE_LEVER, None, gpu_index, True)
    wl = p.workload
    eng = card.get("engine") or {}
    eff = effective_config(eng.get("name") or "unknown", eng.get("version"), wl.get("model"), wl.get("model_revision"),
                           wl.get("engine_args") or {}, wl.get("env") or {})
    ident: dict[str, Any] = {"config": eff, "launcher": wl.get("launcher"), "requests": wl.get("requests") or {}}
    if wl.get("launcher") == "command":
        ident["argv"] = list(wl.get("argv") or [])
    return {"plan": p, "effective_config": eff, "config_fingerprint": fingerprint(eff),
            "workload_fingerprint": fingerprint(ident)}


def card_for_command(argv: list[str], requests: dict | None = None) -> dict:
    """A card for a generic ``-- CMD ...`` workload (no log yet: class unknown, no numbers, no levers)."""
    from oomdoctor.card.workload import workload_from_argv

    wl = workload_from_argv(list(argv), dict(requests or {}))
    wl["source"] = "oomdoctor ladder -- CMD"
    engine = "vllm" if wl.get("launcher") == "vllm-serve" else None
    c = cardmod.Card(
        id=cardmod.new_id("unknown", ""), created_at=cardmod.now_iso(),
        summary="free-memory ladder of a command workload",
        source={"path": "(oomdoctor ladder -- CMD)", "sha256": ""},
        engine={"name": engine, "version": None},
        classification={**contract.classification("unknown"), "rule": None, "engine": engine, "engine_version": None},
        evidence=[], numbers={}, device={"status": "not_captured", "reason": "oomdoctor ladder", "source": "nvml", "gpus": []},
        workload=wl, levers=[], notes=["created by oomdoctor ladder for a command given after --"],
    )
    return c.to_dict()
