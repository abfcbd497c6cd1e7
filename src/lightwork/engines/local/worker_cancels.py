"""A cancel as the worker sees it: which of its calls the driver cancelled (a mixin of
:class:`worker.Worker`).

The driver appends the task's id to this worker's cancel file (``cancel_path``,
``protocol.cancel_file``), then sends SIGINT (``cancel.py``). The handler
(``worker._on_sigint``, on the main thread) only counts the signal (``cancel_signals``)
and, in a task worker, interrupts the running task if the file names it: a
KeyboardInterrupt, raised at most once per task (``interrupted``), which ``execute`` turns
into the "cancelled" outcome. An actor's running call is never interrupted (as in Ray:
its state could be left half-changed): its ids are read, for ``is_canceled()`` and the
start check, and an async actor's coroutines are cancelled on its loop.

The file is read (``cancelled``) only when a signal is unread (``cancel_signals`` unequal
to ``_signals_read``) or, before a call on a pool thread, when it grew
(``_cancel_file_grew``): a call's start check is a comparison, and a cancel that lands
before its task starts is found when it starts. The counts start unequal: a SIGINT that
came before ``main`` installed the handler was lost, so the first check reads the file.
Reads go on from ``_cancel_offset``; the ids read collect in ``cancelled_ids``, and a
call's id leaves it when the call ends (``Worker.execute``). The state is the worker's
(``Worker.__init__``). Several threads read (the main thread, the handler on it, an
actor's pool threads): ``cancelled`` says why none loses a cancel.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightwork.engines.local.worker_state import WorkerState

    _Base = WorkerState
else:
    _Base = object


class WorkerCancels(_Base):
    """The worker's reading of the driver's cancels."""

    def cancelled(self, task_id: int, file_grew: bool = False) -> bool:
        """Whether the driver cancelled ``task_id`` (the file is read only after a SIGINT,
        or when the caller saw it grow)."""
        signals = self.cancel_signals
        if signals != self._signals_read or file_grew:
            start = self._cancel_offset
            try:
                with open(self.cancel_path, "rb") as f:
                    f.seek(start)
                    text = f.read()
            except OSError:
                text = b""
            end = text.rfind(b"\n") + 1  # a line being written now is read next time
            self.cancelled_ids.update(int(line) for line in text[:end].split())
            # Several readers (an actor's threads, the SIGINT handler interrupting one):
            # move on only from where this one started. Re-reading a line adds nothing;
            # skipping one would lose a cancel.
            if self._cancel_offset == start:
                self._cancel_offset = start + end
            # Read up to ``signals`` only: a SIGINT that came meanwhile (its id perhaps
            # written after this read) leaves the counts unequal, and the file is read
            # again. Another thread checking meanwhile reads the file itself.
            self._signals_read = signals
        return task_id in self.cancelled_ids

    def _cancel_file_grew(self) -> bool:
        """Whether the driver appended to the cancel file since it was last read.

        The start check of a call on a pool thread (threaded and async actors) cannot rely
        on the SIGINT handler: it runs on the main thread, which on a loaded host may get
        the GIL only after the pool thread started the call. The driver writes the line
        before it signals, so one ``stat`` finds the cancel without the handler. Calls on
        the main thread don't need it: the handler runs there before the next bytecode.
        """
        try:
            return os.stat(self.cancel_path).st_size > self._cancel_offset
        except OSError:  # no cancel yet: the driver creates the file with the first one
            return False

    def is_canceled(self) -> bool:
        """``get_runtime_context().is_canceled()``: was the running call cancelled?"""
        frame = self.current
        if frame is None:
            return False
        return bool(self.cancel_signals != self._signals_read or self.cancelled_ids) and \
            self.cancelled(frame[0])
