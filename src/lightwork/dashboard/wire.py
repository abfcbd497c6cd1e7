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

import array
import struct
from typing import Any

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


def unpack(count: int, attached: bytes) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
    """The records' columns: floats and ints by column name (``array`` of "d" and "q"),
    the name codes and the state codes (positions in the reply's tables)."""
    if len(attached) != attached_size(count):
        raise ValueError(f"a sync's attached records ({len(attached)} bytes) do not match "
                         f"its count ({count})")
    rows_end = count * ROW_BYTES
    # View the rows as doubles and as int64s (no copy) and take each column with a
    # strided slice (in C; one column's bytes at a time).
    width = len(FLOAT_COLUMNS) + len(INT_COLUMNS)
    rows = memoryview(attached)[:rows_end]
    as_floats, as_ints = rows.cast("d"), rows.cast("q")
    floats = {name: array.array("d", as_floats[k::width].tobytes())
              for k, name in enumerate(FLOAT_COLUMNS)}
    ints = {name: array.array("q", as_ints[k::width].tobytes())
            for k, name in enumerate(INT_COLUMNS, start=len(FLOAT_COLUMNS))}
    name_codes = array.array(NAME_CODE, attached[rows_end:rows_end + 4 * count])
    state_codes = array.array(STATE_CODE, attached[rows_end + 4 * count:])
    return floats, ints, name_codes, state_codes
