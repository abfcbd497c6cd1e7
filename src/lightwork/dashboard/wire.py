"""The format of the task records a ``dashboard_sync`` carries (both sides read this).

The driver (``feed``) packs, the dashboard process (``mirror``) unpacks. The records
travel as bytes attached after the reply's JSON line (``control.Attached``), in this
order, for ``count`` records:

* ``count`` rows of ``row_bytes`` bytes each (the reply's ``tasks.row_bytes``, a multiple
  of 8): the fields of each record that the dashboard reads, packed with native
  alignment. The numbers are 8-byte words in native byte order (one machine): the
  ``FLOAT_COLUMNS`` float64, the ``INT_COLUMNS`` int64, at the word of the row that the
  reply's ``tasks.columns`` names; the other bytes mean nothing here (the driver finds
  the records with an error or retries by two flag bytes of its own);
* ``count`` name codes (int32): positions in the reply's ``names`` table;
* ``count`` state codes (int8): positions in the reply's ``states`` table.

The JSON part carries those two tables and, sparse, the records with retries or an
error. Arrays of numbers and JSON only: nothing received is ever unpickled.

Standard library only: the dashboard process imports this without the runtime.
"""

from __future__ import annotations

import array
from typing import Any

FLOAT_COLUMNS = ("submitted", "deps_ready", "dispatched", "started", "args_loaded",
                 "finished", "stored")
INT_COLUMNS = ("task_id", "worker_id", "pid", "attempt", "arg_size", "result_size", "actor_id",
               "rss_peak", "rss_change")
NAME_CODE, STATE_CODE = "i", "b"  # array typecodes of the code columns
MAX_ROW_BYTES = 4_096
MAX_ERROR_CHARS = 300
DEFAULT_MAX_RECORDS = 20_000  # per sync (bounds both sides' peak memory); the rest comes next


def attached_size(count: int, row_bytes: int) -> int:
    """How many bytes ``count`` records take after the JSON line."""
    return count * (row_bytes + 4 + 1)


def unpack(tasks: dict[str, Any], attached: bytes) -> tuple[dict[str, Any], dict[str, Any],
                                                             Any, Any]:
    """The records of a sync's ``tasks`` part: floats and ints by column name (``array``
    of "d" and "q"), the name codes and the state codes (positions in its tables)."""
    count, row_bytes, words = int(tasks["count"]), tasks.get("row_bytes"), tasks.get("columns")
    if (isinstance(row_bytes, bool) or not isinstance(row_bytes, int)
            or not 8 <= row_bytes <= MAX_ROW_BYTES or row_bytes % 8):
        raise ValueError(f"a sync's row_bytes must be a multiple of 8 up to {MAX_ROW_BYTES}, "
                         f"got {row_bytes!r}")
    width = row_bytes // 8
    if not isinstance(words, dict) or any(
            isinstance(words.get(name), bool) or not isinstance(words.get(name), int)
            or not 0 <= words[name] < width for name in FLOAT_COLUMNS + INT_COLUMNS):
        raise ValueError(f"a sync's columns must give each of {FLOAT_COLUMNS + INT_COLUMNS} "
                         f"a word of its {width}-word rows, got {words!r}")
    if len(attached) != attached_size(count, row_bytes):
        raise ValueError(f"a sync's attached records ({len(attached)} bytes) do not match "
                         f"its count ({count} of {row_bytes} bytes)")
    rows_end = count * row_bytes
    # View the rows as doubles and as int64s (no copy) and take each column with a
    # strided slice (in C; one column's bytes at a time).
    rows = memoryview(attached)[:rows_end]
    as_floats, as_ints = rows.cast("d"), rows.cast("q")
    floats = {name: array.array("d", as_floats[words[name]::width].tobytes())
              for name in FLOAT_COLUMNS}
    ints = {name: array.array("q", as_ints[words[name]::width].tobytes())
            for name in INT_COLUMNS}
    name_codes = array.array(NAME_CODE, attached[rows_end:rows_end + 4 * count])
    state_codes = array.array(STATE_CODE, attached[rows_end + 4 * count:])
    return floats, ints, name_codes, state_codes
