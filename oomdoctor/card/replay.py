"""The requests a runtime failure was serving, read from the log's own figures, so that a retest replays them.

A start-up failure needs no requests to reproduce: the smoke request (``workload.DEFAULT_REQUESTS``) only checks
that a passing start serves. A runtime OOM happened while the engine ran a batch, and a retest that sends one short
prompt never reaches it (a real H200 retest said "not reproduced": ``incidents/h200-retest-2026-12-02/``). When a
model step fails, vLLM dumps the step it was running (``dump_input.py``: each new request's
``prompt_token_ids_len`` and its ``SamplingParams(... max_tokens=N ...)``; the scheduler's running and waiting
counts), and the offline API's progress bar says how many prompts were submitted (``Processed prompts: ... | 0/64``).
Those figures give the requests to replay: that many prompts of that length asking for that many tokens, all at
once (the offline API submits them together; a server's client sends them concurrently). Only numbers are read,
each bounded; nothing of a prompt's text is in a log, and none is replayed.
"""
from __future__ import annotations

from typing import Any

from oomdoctor.card.records import Requests

MAX_REPLAY_REQUESTS = 1024          # a retest is a reproduction, not a load test
MAX_REPLAY_PROMPT_TOKENS = 1 << 20
MAX_REPLAY_OUTPUT_TOKENS = 1 << 16


def _first_number(matches: list, name: str) -> int | None:
    for m in matches:
        v = m.numbers.get(name)
        if isinstance(v, (int, float)) and v > 0:
            return int(v)
    return None


def replay_requests(matches: list, max_model_len: Any = None) -> tuple[Requests, str] | None:
    """The requests of the failing step (and how they were read), or None when the log shows no failing step."""
    plen = _first_number(matches, "oom_request_prompt_tokens")
    if plen is None:
        return None
    out_tokens = _first_number(matches, "oom_request_max_tokens") or 16
    total = _first_number(matches, "offline_requests_total")
    running = _first_number(matches, "oom_running_requests")
    waiting = _first_number(matches, "oom_waiting_requests") or 0
    if total:
        count, why = total, f"{total} prompts submitted (the offline progress bar)"
    elif running:
        count = running + waiting
        why = f"{running} running + {waiting} waiting when the step failed (the scheduler's stats)"
    else:
        count, why = 1, "one request (the log gives no count)"
    count = min(count, MAX_REPLAY_REQUESTS)
    plen = min(plen, MAX_REPLAY_PROMPT_TOKENS)
    if isinstance(max_model_len, int) and max_model_len > 1:
        plen = min(plen, max_model_len - 1)
        out_tokens = max(1, min(out_tokens, max_model_len - plen))
    out_tokens = min(out_tokens, MAX_REPLAY_OUTPUT_TOKENS)
    req = Requests(kind="replay", prompt_tokens=plen, max_tokens=out_tokens, concurrency=count, count=count)
    return req, (f"the failing step in the log: prompts of {plen:,} tokens asking for {out_tokens:,} (vLLM's dump of "
                 f"the step), {why}")
