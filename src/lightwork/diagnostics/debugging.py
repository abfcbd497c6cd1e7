"""``lightwork debug``: list the calls paused in the debugger, attach to one.

The session's driver lists them (the control operation ``debug_paused``; see
``lightwork.kernel.pauses``); each paused call listens on a Unix socket of its own in
the session directory, or on a cluster worker a TCP socket that wants the session's
token first, which the driver's row carries (``lightwork.kernel.debug_wire``; the
design is ``lightwork.kernel.debugger``'s). Attaching proxies this terminal
to it: lines typed here go to pdb, what pdb writes comes back. The terminal stays in
its normal (cooked) mode, so it echoes and edits each line itself and Ctrl-C reaches
this process, not the worker.

Ending a session: the worker sends a status line (``c``: the call continues; ``q``:
it ends with ``BdbQuit``; its outermost frame returned while stepping; it ended), which
is printed in words here (a worker that refused the token sends ``refused``). End of file here (Ctrl-D) or Ctrl-C detaches and leaves the
call paused for the next ``lightwork debug``. A connection that closes without a
status line means the worker process is gone (killed or crashed while paused).
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import Any, TextIO

from lightwork.kernel import debug_wire
from lightwork.kernel.pauses import STATUS

#: What the worker's status line means, as this terminal says it.
ENDINGS = {
    "continued": "the call continues",
    "returned": "the call's function returned; the call runs on to its end",
    "quit": "you quit the debugger: the call ends with bdb.BdbQuit as its error",
    "ended": "the call was interrupted (cancelled, or its worker is exiting)",
    "refused": ("the worker refused the connection: it did not carry this session's "
                "token. Attach with `lightwork debug` on the driver's machine, as the "
                "user who runs the driver"),
}


def format_paused(rows: list[dict[str, Any]]) -> str:
    """The paused calls as a numbered table."""
    header = ("#", "TASK", "NAME", "KIND", "WHERE", "PID", "PAUSED")
    cells = [(str(number), str(row["task_id"]), row["name"], row["kind"],
              f"{row['function']} {_short(row['file'])}:{row['line']}", _pid(row),
              _duration(row["paused_s"]))
             for number, row in enumerate(rows)]
    widths = [max(len(column), *(len(r[i]) for r in cells)) for i, column in enumerate(header)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines) + "\n"


def _pid(row: dict[str, Any]) -> str:
    """The worker's pid, and its host for a cluster worker's call."""
    worker = row.get("worker")
    if not worker:
        return str(row["pid"])
    host = str(worker).split("://", 1)[-1].rpartition(":")[0]
    return f"{row['pid']}@{host}"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{seconds:02d}s"


def _short(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return relative if not relative.startswith("..") else path


def choose(rows: list[dict[str, Any]], which: str | None,
           by_number: bool = False) -> dict[str, Any] | None:
    """The paused call ``which`` names: its task id (as ``lightwork list tasks`` shows
    it), or with ``by_number`` its # in the table. None when nothing matches."""
    if which is None:
        return rows[0] if len(rows) == 1 else None
    if by_number:
        return rows[int(which)] if which.isdigit() and int(which) < len(rows) else None
    for row in rows:
        if str(row["task_id"]) == which:
            return row
    return None


def attach(row: dict[str, Any], stdin: TextIO | None = None, out: TextIO | None = None) -> int:
    """Proxy this terminal to the paused call of ``row`` until its session ends or the
    user detaches; 0 when the session ended or was left, 1 when the worker is gone."""
    stdin = stdin or sys.stdin
    out = out or sys.stdout
    try:
        sock = debug_wire.connect(row)
    except OSError as exc:
        print(f"lightwork: cannot attach to {row['name']} (task {row['task_id']}): {exc}; "
              "it may have resumed or ended meanwhile: run `lightwork debug` again",
              file=sys.stderr)
        return 1
    in_fd = stdin.fileno()
    pending = b""
    try:
        while True:
            ready, _, _ = select.select([sock, in_fd], [], [])
            if sock in ready:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return _gone(row, out)
                pending += chunk
                text, mark, rest = pending.partition(STATUS.encode())
                out.write(text.decode("utf-8", "replace"))
                out.flush()
                if mark:
                    status = rest.split(b"\n", 1)[0].decode("utf-8", "replace")
                    print(f"\nlightwork: {ENDINGS.get(status, status)}", file=out)
                    return 1 if status == "refused" else 0
                pending = b""
            if in_fd in ready:
                data = os.read(in_fd, 1 << 16)
                if not data:  # Ctrl-D: leave the call paused
                    _detached(row, out)
                    return 0
                sock.sendall(data)
    except KeyboardInterrupt:
        _detached(row, out)
        return 0
    except OSError:
        return _gone(row, out)
    finally:
        sock.close()


def _detached(row: dict[str, Any], out: TextIO) -> None:
    print(f"\nlightwork: detached; {row['name']} (task {row['task_id']}) stays paused: "
          "`lightwork debug` attaches again", file=out)


def _gone(row: dict[str, Any], out: TextIO) -> int:
    """The connection closed without a status line: say whether the worker is gone."""
    if "worker" in row:  # a cluster worker, maybe on another machine: no pid to look at
        print(f"\nlightwork: the connection to {row['name']} (task {row['task_id']}) on the "
              f"worker {row['worker']} closed without a word: the worker was killed or "
              "crashed while paused, or the network dropped. Its caller gets "
              "WorkerCrashedError (or the task is retried, if it has retries left)", file=out)
        return 1
    if _process_ended(int(row["pid"])):
        print(f"\nlightwork: the worker running {row['name']} (task {row['task_id']}, pid "
              f"{row['pid']}) is gone: it was killed or crashed while paused. Its caller gets "
              "WorkerCrashedError (or the task is retried, if it has retries left)", file=out)
    else:  # the worker closed the socket without a word: it is ending
        print(f"\nlightwork: the session of {row['name']} (task {row['task_id']}) ended",
              file=out)
    return 1


def _process_ended(pid: int, patience: float = 1.0) -> bool:
    """Whether ``pid`` exited (a zombie not reaped yet counts), waiting up to
    ``patience`` seconds: the socket closes a moment before the process is gone."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def run(collect: Any, which: str | None, list_only: bool, wait: float, out: TextIO,
        stdin: TextIO | None = None) -> int:
    """``lightwork debug``: list the paused calls (``collect()``), attach to the chosen one."""
    stdin = stdin or sys.stdin
    deadline = time.monotonic() + wait
    while True:
        rows = collect()
        if rows or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if not rows:
        print("no call is paused in the debugger (breakpoint() in a task pauses it; "
              "--wait SECONDS waits for one)", file=out)
        return 0 if list_only else 1
    if list_only:
        print(format_paused(rows), file=out, end="")
        return 0
    row = choose(rows, which)
    if row is None and which is not None:
        print(f"no paused call is task {which}:", file=out)
    while row is None:
        print(format_paused(rows), file=out, end="")
        print("attach to which (its #; Enter lists again, q leaves)? ", file=out, end="")
        out.flush()
        line = stdin.readline()
        if not line or line.strip().lower() == "q":
            return 0
        rows = collect()
        if not rows:
            print("no call is paused any more", file=out)
            return 0
        row = choose(rows, line.strip(), by_number=True) if line.strip() else None
    return attach(row, stdin, out)
