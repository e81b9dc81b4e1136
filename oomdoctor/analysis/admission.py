"""KV-aware admission: admit, queue or reject a request against a KV *byte* budget.

Why bytes, not request counts (docs/incidents.md, incident 2): a queue that counted requests let a
67,881-token request meet a VRAM check it could never pass while the queue was empty, and the
client got ``503, Retry-After: 5`` for requests that take 70-150 s. The fix is a second gate:

- a **budget** of KV bytes fixed when the engine loads: ``total - resident weights - reserves``
  (activation headroom, a minimum-free floor). Not a live free-memory reading: free memory seen by
  the driver drifted by about 5 GiB between idle ranks (allocator pool retention), and a reload
  gave a budget 162 MiB lower;
- each request holds ``need = (prompt_tokens + max_output_tokens) x kv_bytes_per_token`` (per card)
  as permits from admission until it finishes (``release``);
- ``need > budget``: rejected **permanently** (never admissible, HTTP 400-like: shorten it);
- fits the budget but not what is free of it now: waits in a **FIFO** queue. A large request at
  the head is not starved: smaller ones behind it do not overtake it, even if they would fit;
- a waiting request gets a deadline from measured request durations (p95 x queue position), not a
  fixed Retry-After.
"""
from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Iterable

from oomdoctor.errors import BadInput
from oomdoctor.units import human_bytes

ADMIT, QUEUE, REJECT = "admit", "queue", "reject"
EXIT_CODES = {ADMIT: 0, QUEUE: 1, REJECT: 1}
MAX_DURATIONS = 1000
_ids = itertools.count(1)


@dataclass(eq=False, frozen=True)
class Request:
    """A request's KV shape. Identity is the object (two equal shapes are two requests)."""

    prompt_tokens: int
    max_output_tokens: int = 0
    id: str = field(default_factory=lambda: f"req-{next(_ids)}")

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "max_output_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise BadInput(f"{name} must be a whole number >= 0, got {v!r}")
        if self.prompt_tokens + self.max_output_tokens == 0:
            raise BadInput("a request needs at least one token (prompt + max output)")

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_output_tokens


@dataclass(frozen=True)
class Decision:
    verdict: str                     # admit | queue | reject
    permanent: bool                  # reject only: True = never admissible (400-like)
    need_bytes: int
    budget_bytes: int
    in_use_bytes: int
    free_bytes: int                  # budget - in_use, when decided
    tokens: int
    kv_bytes_per_token: int
    max_tokens_in_budget: int        # budget // kv_bytes_per_token
    queue_position: int | None       # 1 = head of the queue
    wait_deadline_s: float | None
    p95_duration_s: float | None
    reason: str
    arithmetic: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_dict(self) -> dict:
        return {"decision": self.verdict, "permanent": self.permanent, "need_bytes": self.need_bytes,
                "budget_bytes": self.budget_bytes, "in_use_bytes": self.in_use_bytes, "free_bytes": self.free_bytes,
                "tokens": self.tokens, "kv_bytes_per_token": self.kv_bytes_per_token,
                "max_tokens_in_budget": self.max_tokens_in_budget, "queue_position": self.queue_position,
                "wait_deadline_s": self.wait_deadline_s, "p95_duration_s": self.p95_duration_s,
                "reason": self.reason, "arithmetic": list(self.arithmetic), "exit_code": self.exit_code}


# ----------------------------------------------------------------------------- pure parts
def _whole(name: str, v, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise BadInput(f"{name} must be a whole number >= {minimum}, got {v!r}")
    return v


def need_bytes(prompt_tokens: int, max_output_tokens: int, kv_bytes_per_token: int) -> int:
    """KV bytes a request holds (per card): (prompt + reserved output) x bytes per token."""
    return (_whole("prompt_tokens", prompt_tokens) + _whole("max_output_tokens", max_output_tokens)) * \
        _whole("kv_bytes_per_token", kv_bytes_per_token, 1)


def p95(durations: Iterable[float]) -> float | None:
    """Nearest-rank 95th percentile (the value at rank ceil(0.95 n)); None for no durations."""
    xs = sorted(float(d) for d in durations)
    if not xs:
        return None
    for d in xs:
        if not math.isfinite(d) or d <= 0:
            raise BadInput(f"request durations must be positive seconds, got {d!r}")
    return xs[max(0, math.ceil(0.95 * len(xs)) - 1)]


def wait_deadline(position: int, durations: Iterable[float] | None) -> tuple[float | None, float | None]:
    """(deadline seconds, p95): p95 of measured durations x queue position.

    The estimate assumes the request at position k waits for about k requests to finish, each
    taking at most the p95 duration: it is a deadline to give up at, not a promise."""
    q = p95(durations or [])
    return (None if q is None else round(q * position, 3)), q


def decide(budget_bytes: int, kv_bytes_per_token: int, prompt_tokens: int, max_output_tokens: int = 0,
           in_use_bytes: int = 0, queue_ahead: int = 0, durations_s: Iterable[float] | None = None) -> Decision:
    """Decide one request against a budget of which ``in_use_bytes`` is held and ``queue_ahead``
    requests already wait (FIFO: with anyone waiting, a new request queues even if it fits)."""
    budget = _whole("budget_bytes", budget_bytes, 1)
    bpt = _whole("kv_bytes_per_token", kv_bytes_per_token, 1)
    in_use = _whole("in_use_bytes", in_use_bytes)
    ahead = _whole("queue_ahead", queue_ahead)
    if in_use > budget:
        raise BadInput(f"in-use KV bytes ({in_use}) exceed the budget ({budget}): the budget is the ceiling "
                       "of what admitted requests hold")
    durations = list(durations_s or [])
    req = Request(prompt_tokens, max_output_tokens)
    need = req.tokens * bpt
    free = budget - in_use
    max_tokens = budget // bpt
    arith = [
        f"need = ({req.prompt_tokens:,} prompt + {req.max_output_tokens:,} reserved output) x {bpt:,} B/token "
        f"= {need:,} B ({human_bytes(need)})",
        f"budget = {budget:,} B ({human_bytes(budget)}), in use {in_use:,} B, free {free:,} B ({human_bytes(free)})",
    ]
    common = dict(need_bytes=need, budget_bytes=budget, in_use_bytes=in_use, free_bytes=free, tokens=req.tokens,
                  kv_bytes_per_token=bpt, max_tokens_in_budget=max_tokens)
    if need > budget:
        arith.append(f"need {need:,} B > whole budget {budget:,} B: never admissible "
                     f"(the budget holds at most {max_tokens:,} tokens of prompt + output)")
        return Decision(REJECT, True, queue_position=None, wait_deadline_s=None, p95_duration_s=None,
                        reason=f"request needs {human_bytes(need)} of KV but the whole budget is {human_bytes(budget)}: "
                               f"it can never be admitted; send at most {max_tokens:,} tokens of prompt + max output "
                               "(a permanent error, HTTP 400-like, not a retry)",
                        arithmetic=tuple(arith), **common)
    if ahead == 0 and need <= free:
        arith.append(f"need {need:,} B <= free {free:,} B and nobody waits: admit (holds {need:,} B until released)")
        return Decision(ADMIT, False, queue_position=None, wait_deadline_s=None, p95_duration_s=None,
                        reason=f"admitted: {human_bytes(need)} of KV reserved, {human_bytes(free - need)} left",
                        arithmetic=tuple(arith), **common)
    position = ahead + 1
    deadline, q = wait_deadline(position, durations)
    if ahead:
        arith.append(f"{ahead} request(s) wait ahead: FIFO, no overtaking → position {position}")
    else:
        arith.append(f"need {need:,} B > free {free:,} B: wait at the head of the queue for "
                     f"{need - free:,} B ({human_bytes(need - free)}) to be released")
    if deadline is None:
        arith.append("no measured request durations given: no wait deadline (pass them to get one)")
        when = "no deadline (no measured durations)"
    else:
        arith.append(f"deadline = p95 {q:g} s x position {position} = {deadline:g} s")
        when = f"give up after {deadline:g} s"
    return Decision(QUEUE, False, queue_position=position, wait_deadline_s=deadline, p95_duration_s=q,
                    reason=f"queued at position {position}: fits the budget but not what is free now; {when}",
                    arithmetic=tuple(arith), **common)


# ----------------------------------------------------------------------------- stateful gate
class KvAdmission:
    """A FIFO gate whose permits are KV bytes.

    ``try_admit(req)`` admits, queues or rejects; a queued request is admitted by a later
    ``release`` (which returns those admitted, in order) or by calling ``try_admit`` again
    once it is at the head. Not thread-safe: wrap calls in a lock if several threads share it.
    """

    def __init__(self, budget_bytes: int, kv_bytes_per_token: int, durations_s: Iterable[float] | None = None,
                 max_queue: int | None = None) -> None:
        self.budget_bytes = _whole("budget_bytes", budget_bytes, 1)
        self.kv_bytes_per_token = _whole("kv_bytes_per_token", kv_bytes_per_token, 1)
        self.max_queue = None if max_queue is None else _whole("max_queue", max_queue)
        self._durations: deque[float] = deque(maxlen=MAX_DURATIONS)
        for d in durations_s or []:
            self.record_duration(d)
        self._running: dict[Request, int] = {}
        self._queue: deque[Request] = deque()

    # -- state
    @property
    def in_use_bytes(self) -> int:
        return sum(self._running.values())

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.in_use_bytes

    @property
    def queue(self) -> tuple[Request, ...]:
        return tuple(self._queue)

    @property
    def running(self) -> tuple[Request, ...]:
        return tuple(self._running)

    def need_bytes(self, req: Request) -> int:
        return req.tokens * self.kv_bytes_per_token

    def record_duration(self, seconds: float) -> None:
        """Add a measured request duration (seconds) for the wait deadlines."""
        s = float(seconds)
        if not math.isfinite(s) or s <= 0:
            raise BadInput(f"request durations must be positive seconds, got {seconds!r}")
        self._durations.append(s)

    def state(self) -> dict:
        return {"budget_bytes": self.budget_bytes, "in_use_bytes": self.in_use_bytes, "free_bytes": self.free_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token, "running": [r.id for r in self._running],
                "queue": [{"id": r.id, "need_bytes": self.need_bytes(r)} for r in self._queue],
                "queued_bytes": sum(self.need_bytes(r) for r in self._queue)}

    # -- transitions
    def _decide(self, req: Request, ahead: int) -> Decision:
        return decide(self.budget_bytes, self.kv_bytes_per_token, req.prompt_tokens, req.max_output_tokens,
                      in_use_bytes=self.in_use_bytes, queue_ahead=ahead, durations_s=self._durations)

    def try_admit(self, req: Request) -> Decision:
        if req in self._running:
            raise BadInput(f"{req.id} is already admitted")
        if req in self._queue:
            pos = self._queue.index(req)
            d = self._decide(req, pos)
            if d.verdict == ADMIT:                       # at the head and it fits now
                self._queue.popleft()
                self._running[req] = d.need_bytes
            return d
        d = self._decide(req, len(self._queue))
        if d.verdict == ADMIT:
            self._running[req] = d.need_bytes
        elif d.verdict == QUEUE:
            if self.max_queue is not None and len(self._queue) >= self.max_queue:
                return replace(d, verdict=REJECT, permanent=False, queue_position=None, wait_deadline_s=None,
                               reason=f"queue full ({self.max_queue} waiting): rejected for now (503-like; retry later)",
                               arithmetic=d.arithmetic + (f"queue depth {len(self._queue)} >= max {self.max_queue}: reject",))
            self._queue.append(req)
        return d

    def release(self, req: Request) -> list[Request]:
        """Return ``req``'s permits; admit waiting requests from the head while they fit.

        Returns the requests admitted now, in FIFO order (the caller starts them)."""
        if req not in self._running:
            raise BadInput(f"{req.id} is not admitted: nothing to release")
        del self._running[req]
        return self._drain()

    def cancel(self, req: Request) -> list[Request]:
        """Drop a waiting request (its deadline passed, or the client left).

        Returns the requests admitted because it no longer blocks the head, in FIFO order."""
        try:
            self._queue.remove(req)
        except ValueError:
            raise BadInput(f"{req.id} is not waiting: nothing to cancel")
        return self._drain()

    def _drain(self) -> list[Request]:
        admitted = []
        while self._queue:
            head = self._queue[0]
            need = self.need_bytes(head)
            if need > self.free_bytes:
                break                                     # no overtaking the head
            self._queue.popleft()
            self._running[head] = need
            admitted.append(head)
        return admitted
