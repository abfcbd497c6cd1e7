"""The format of the task records a ``dashboard_sync`` carries (both sides read this).

The driver (``feed``) packs, the dashboard process (``mirror``) unpacks. The records
travel as bytes attached after the reply's JSON line (``control.Attached``), in this
order, for ``count`` records:

* ``count`` rows of ``ROW_FORMAT``: the ``FLOAT_COLUMNS`` (monotonic seconds, float64)
  then the ``INT_COLUMNS`` (int64), native byte order (one machine);
* ``count`` name codes (int32): positions in the reply's ``names`` table;
* ``count`` state codes (int8): positions in the reply's ``states`` table.

The JSON part carries those two tables and, sparse, the records with retries or an
error. Arrays of numbers and JSON only: nothing received is ever unpickled.

Standard library only: the dashboard process imports this without the runtime.
"""

from __future__ import annotations

import struct

FLOAT_COLUMNS = ("submitted", "deps_ready", "dispatched", "started", "args_loaded",
                 "finished", "stored")
INT_COLUMNS = ("task_id", "worker_id", "pid", "attempt", "arg_size", "result_size", "actor_id")
ROW_FORMAT = f"={len(FLOAT_COLUMNS)}d{len(INT_COLUMNS)}q"
ROW_BYTES = struct.calcsize(ROW_FORMAT)
NAME_CODE, STATE_CODE = "i", "b"  # array typecodes of the code columns
MAX_ERROR_CHARS = 300
DEFAULT_MAX_RECORDS = 20_000  # per sync (bounds both sides' peak memory); the rest comes next


def attached_size(count: int) -> int:
    """How many bytes ``count`` records take after the JSON line."""
    return count * (ROW_BYTES + 4 + 1)
