"""``init(dashboard=True)``: the dashboard as a process beside the program.

The program starts ``python .../dashboard/_serve.py --address SOCKET --child`` (the lean
dashboard process: no runtime imported, see ``_serve``) and reads
the URL from the first line of its output (the child makes the token; it never appears
on a command line). The child:

* is in a session of its own (``start_new_session``), so a Ctrl-C meant for the program
  does not print a second traceback from the dashboard;
* asks the program nothing while no page is open (``server``'s "Syncing"): the program
  pays nothing for it then. A page that opens later gets the totals (the driver's
  cumulative counts) and the records still in the event log at its first sync;
* gets one last sync at ``shutdown()``: the program writes ``sync`` on the child's stdin
  and waits for the answer (at most ``FINAL_SYNC_TIMEOUT_S``), then closes the pipe. With
  a page open it brings the last records; with none, only the counts and the live
  picture (no record is packed), so a page opened in the child's last seconds still
  shows the final totals;
* follows the program's end, leaving nothing behind: the end of its stdin (the program
  closed it at ``shutdown()``, or died, even by SIGKILL: the kernel closes the pipe), or
  a new parent pid, means the program is gone. It then exits within
  ``server.NO_PAGE_EXIT_S`` if no page is open, and after ``server.PAGE_GRACE_S`` at
  most if one is (the page says so). The pipe's end is not inheritable, so no other
  process of the session keeps it open; the parent-pid check covers a program that
  forked itself without exec.
"""

from __future__ import annotations

import os
import select
import subprocess
import time

STARTUP_TIMEOUT_S = 15.0
FINAL_SYNC_TIMEOUT_S = 3.0


class DashboardProcess:
    """The program's handle on its dashboard child."""

    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        self.process = process
        self.url = url

    def final_sync(self) -> None:
        """Ask the child for a last sync and wait for it (the session is still open)."""
        process = self.process
        if process.poll() is not None or process.stdin is None or process.stdout is None:
            return
        try:
            process.stdin.write(b"sync\n")
            process.stdin.flush()
            _read_line(process, FINAL_SYNC_TIMEOUT_S)
            process.stdin.close()
        except (OSError, TimeoutError):
            pass

    def stop(self) -> None:
        """End the child now (tests; a program that wants no page after it ends)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start(socket_path: str, port: int = 0) -> DashboardProcess:
    """Start the dashboard child for the session at ``socket_path``; return once it serves."""
    from lightwork.dashboard import serve_command, serve_env

    command = serve_command(socket_path, port, "--child")
    # Its stderr goes nowhere: holding the program's stderr open would keep whoever reads
    # the program's output (a pipe, ``subprocess.run``) waiting for the dashboard to exit.
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, start_new_session=True,
                               env=serve_env())
    try:
        url = _read_line(process, STARTUP_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        process.wait()
        raise RuntimeError(f"the dashboard did not start within {STARTUP_TIMEOUT_S:g} s; run "
                           "`lightwork dashboard` in a terminal to see why") from None
    if not url.startswith("http://127.0.0.1:"):
        process.wait(5.0)
        raise RuntimeError("the dashboard could not start (see the message above); run "
                           "`lightwork dashboard` in a terminal to retry")
    return DashboardProcess(process, url)


def _read_line(process: subprocess.Popen[bytes], timeout: float) -> str:
    """One line of the child's stdout within ``timeout`` (raw reads: no buffering surprises)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()

