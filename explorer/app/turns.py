"""One decode at a time across every session of the page, first come first served, and a waiting Run that says so.

The Run handler does not sit silently in Gradio's queue behind another tab's run: it enters its own line here,
and until its turn comes its lanes say "queued: N ahead of you (waiting for another run to finish, started
X s ago)". Measure, Audit, the engine comparison and a preset load take the same turn (silently: their status line
shows Gradio's progress), so a Run never decodes beside any of them either.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

POLL_S = 0.5  # how often a waiting Run refreshes its words


class Ticket:
    """One caller's place: it arrived, then (once its turn came) started."""

    def __init__(self, what: str) -> None:
        self.what, self.arrived, self.started = what, time.monotonic(), None


class Turns:
    """A first-come-first-served lock whose waiters can tell how many are ahead and how long the holder has run."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._line: list[Ticket] = []  # waiting, in order of arrival
        self._holder: Ticket | None = None

    def take(self, ticket: Ticket, timeout: float | None = None) -> bool:
        """True once it is this ticket's turn (it then holds it until ``leave``); False after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._holder is not None or self._line[0] is not ticket:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            self._line.pop(0)
            self._holder, ticket.started = ticket, time.monotonic()
            return True

    def leave(self, ticket: Ticket) -> None:
        """Give the turn back, or leave the line (a Run stopped while it waited)."""
        with self._cond:
            if self._holder is ticket:
                self._holder = None
            elif ticket in self._line:
                self._line.remove(ticket)
            self._cond.notify_all()

    def words(self, ticket: Ticket) -> str:
        """What a waiting ticket tells its user: how many are ahead, and since when the current one runs."""
        with self._cond:
            holder = self._holder
            ahead = (self._line.index(ticket) if ticket in self._line else 0) + (holder is not None)
            since = f", started {time.monotonic() - holder.started:.0f} s ago" if holder is not None else ""
            what = holder.what if holder is not None else "the run ahead"
        return f"queued: {ahead} ahead of you (waiting for another {what} to finish{since})"

    @contextmanager
    def ticket(self, what: str) -> Iterator[Ticket]:
        """A place in the line for the ``with`` block; it is given back however the block ends (Stop included)."""
        ticket = Ticket(what)
        with self._cond:
            self._line.append(ticket)
        try:
            yield ticket
        finally:
            self.leave(ticket)

    @contextmanager
    def held(self, what: str) -> Iterator[None]:
        """Wait silently for the turn, hold it for the block."""
        with self.ticket(what) as ticket:
            self.take(ticket)
            yield


DECODES = Turns()  # every decode of this process: Run, Measure, Audit, engine comparison, preset load


def taking_turn(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    """``fn`` (a function or a generator function, a Gradio handler) run while holding ``DECODES``' turn."""
    if inspect.isgeneratorfunction(fn):
        def handler(*args: Any) -> Iterator[Any]:
            with DECODES.held(what):
                yield from fn(*args)
    else:
        def handler(*args: Any) -> Any:
            with DECODES.held(what):
                return fn(*args)
    return functools.wraps(fn)(handler)
