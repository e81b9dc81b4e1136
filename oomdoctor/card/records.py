"""The records that travel between stages: a workload, a lever, an attempt, an incident card.

They are TypedDicts, not classes, because they ARE the card's YAML/JSON (``incident-card.schema.json``): a
card is read with ``oomdoctor.safeyaml.load`` and written back as it was, so the typed view costs nothing at run time.
Every key is optional (``total=False``) where the schema allows it to be absent.
"""
from __future__ import annotations

from typing import Any, TypedDict


class Requests(TypedDict, total=False):
    """What a re-run sends to the engine (``workload.requests``)."""
    kind: str
    prompt_tokens: int
    max_tokens: int
    concurrency: int
    count: int


class Workload(TypedDict, total=False):
    """How the engine was launched and with what (``card.workload``)."""
    launcher: str                      # vllm-serve, vllm-llm, command, unknown
    launcher_assumed: bool             # the paste shows neither launcher: vllm-serve assumed
    model: str | None
    model_revision: str | None
    argv: list[str]
    base_args: dict[str, Any]
    engine_args: dict[str, Any]        # the explicit arguments
    explicit_args: list[str]
    launch_args: dict[str, Any]        # the user's other explicit arguments (port, host ...; secrets masked)
    resolved: dict[str, Any]           # what the engine resolved them to
    env: dict[str, str]
    requests: Requests
    requests_source: str               # how requests other than the smoke request were read (card/replay.py)
    source: str
    gpu_total_bytes: int
    free_at_start_bytes: int
    free_at_start_source: str
    emulate_free_bytes: int | None
    card_emulate_free_bytes: int | None
    co_tenant_bytes: int | None
    baseline: dict[str, Any] | None
    harness_cmd: list[str] | str
    env_revealed: list[dict[str, Any]]  # env variables the engine's own lines state, each with its line
    parallel: dict[str, int]            # tensor/pipeline/data parallel sizes resolved, and the GPUs they need
    port: int                           # the server's port (explicit --port or "Starting vLLM server on ...")
    header_dropped: list[str]          # what a log header said about the launch and was not taken (data only)


class Lever(TypedDict, total=False):
    """ONE setting to change (``card.levers[i]``): the value, why, what it costs, what the arithmetic predicts."""
    id: str
    change: dict[str, Any]
    rank: int
    predicted: dict[str, Any]
    cost: str
    basis: str
    applies_as: str                    # flag, env, process, server
    explicit_override: bool
    arithmetic: list[str]
    needs_hardware: str                # the device cannot apply it (more GPUs, another GPU): never run, listed last
    flag: str                          # the change in the engine's own words (--mem-fraction-static 0.83, num_ctx 4096)
    _score: float                      # ranking only: removed before the lever leaves the engine
    cause: bool                        # ranking only: this setting is what the failure names


class NextLever(TypedDict, total=False):
    id: str
    change: dict[str, Any]
    predicted: dict[str, Any]
    cost: str


class PlanLever(TypedDict):
    """A lever of ``plan --json``: the change and the memory model's prediction with it."""
    id: str
    change: dict[str, Any]
    predicted: dict[str, Any]
    cost: str
    source: str


class Attempt(TypedDict, total=False):
    """One re-run (real or twin) of the card's workload with one lever (``card.attempts[i]``)."""
    n: int
    at: str
    lever: str
    change: dict[str, Any]
    base_changes: list[dict[str, Any]]
    engine: dict[str, Any]
    config_fingerprint: str
    effective_config: dict[str, Any]
    argv: list[str]
    emulate_free_bytes: int | None
    oomdoctor_version: str
    notes: list[str]
    outcome: str
    signature_gone: bool | None
    served: bool | None
    target_device: str | None
    device_before: dict[str, Any]
    gpu: str | None
    duration_s: float
    log_path: str
    log_sha256: str | None
    ballast: dict[str, Any]
    classification: dict[str, Any]
    evidence: list[dict[str, Any]]
    perf: dict[str, Any] | None
    perf_check: dict[str, Any]
    next_lever: NextLever | None
    phase_reached: str | None          # the last start-up phase the run's log reached
    inconclusive: dict[str, Any]       # reason, fix, evidence: the run says nothing about the lever
    expected_chain: dict[str, Any]     # what the memory model expects from this lever to the end of the start
    chain_check: dict[str, Any]        # expected vs observed follow-up: confirmed / not_confirmed


class CardDict(TypedDict, total=False):
    """An incident card as read from / written to YAML (``oomdoctor.incident/v1``)."""
    schema: str
    oomdoctor_version: str
    id: str
    created_at: str
    summary: str
    source: dict[str, Any]
    engine: dict[str, Any]
    classification: dict[str, Any]
    phase_reached: str | None
    evidence: list[dict[str, Any]]
    numbers: dict[str, Any]
    numbers_source: dict[str, Any]
    numbers_printed: dict[str, str]    # byte numbers the log printed rounded (``124.52 GiB``): their bytes are rebuilt
    numbers_by_process: dict[str, Any]
    device: dict[str, Any]
    log_device: list[Any]
    workload: Workload
    levers: list[Lever]
    runtime: dict[str, Any]
    notes: list[str]
    attempts: list[Attempt]
    snapshot: dict[str, Any]
    model_check: dict[str, Any]
    ladder: dict[str, Any]
    plugin: dict[str, Any]
