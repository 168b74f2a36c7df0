"""How far a long measurement is, told to whoever listens: the page sets a listener for its progress line ("T = 0:
request 4 of 12, the speculative lane, about 40 s left"); the CLI keeps its tqdm bars and sets none."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar

# (done, total, what is running now, estimated seconds left or None before the first step ends)
Listener = Callable[[int, int, str, float | None], None]
LISTENER: ContextVar[Listener | None] = ContextVar("measure_progress", default=None)


def tell(done: int, total: int, what: str, started: float) -> None:
    """``done`` of ``total`` steps have ended since ``started`` (time.perf_counter()); ``what`` runs now."""
    listen = LISTENER.get()
    if listen is not None:
        spent = time.perf_counter() - started
        listen(done, total, what, spent / done * (total - done) if done else None)
