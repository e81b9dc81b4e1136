"""The card's schema speaks the contract: every place it lists classes lists exactly the contract's classes (an
attempt whose new log is a `cascade_only` could not be written back: a real H200 retest lost its passing attempt,
incidents/h200-retest-2026-12-02-afternoon/walk-W1-stopped/), and every lever id enum is the contract's."""
from __future__ import annotations

from typing import Any, Iterator

from oomdoctor import contract
from oomdoctor.card.store import schema


def _enums(node: Any, path: str = "") -> Iterator[tuple[str, list]]:
    if isinstance(node, dict):
        if isinstance(node.get("enum"), list):
            yield path, node["enum"]
        for k, v in node.items():
            yield from _enums(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _enums(v, f"{path}[{i}]")


def test_every_class_enum_is_the_contracts() -> None:
    classes = [(p, e) for p, e in _enums(schema()) if p.endswith("/class") or "runtime_oom" in e]
    assert len(classes) >= 2, classes          # the card's classification and each attempt's
    for path, enum in classes:
        assert enum == list(contract.CLASSES), path


def test_the_lever_id_enum_is_the_contracts() -> None:
    ids = [e for p, e in _enums(schema()) if p.endswith("/levers/items/properties/id")]
    assert ids == [list(contract.LEVERS)]
