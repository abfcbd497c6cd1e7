"""cloudpickle, keeping the file name of the code it pickles by value.

Functions and classes that a worker cannot import by name (defined in ``__main__``, a
notebook, a test module, a closure) travel by value: cloudpickle pickles their code
objects. From cloudpickle 3.1.3 on, it replaces each code object's ``co_filename`` with
``"<dynamic-code>"`` so that its pickles are byte-for-byte deterministic. A remote
traceback then says ``File "<dynamic-code>", line 36`` instead of naming the user's file,
``linecache`` cannot show the source line, and ``lightwork stack`` loses the same facts:
the diagnostics this project exists for.

So every pickle lightwork makes with cloudpickle goes through :func:`dumps`, whose pickler
sends a code object as its ``marshal`` form, which keeps every field, the file name
included. ``marshal`` is tied to the interpreter's version; so is cloudpickle's own form
of a code object, and a worker always runs the driver's Python. The pickles are no longer
byte-for-byte deterministic across machines, which nothing here relies on.
"""

from __future__ import annotations

import io
import marshal
import types
from collections import ChainMap
from typing import Any

import cloudpickle


def _reduce_code(code: types.CodeType) -> tuple[Any, tuple[bytes]]:
    return marshal.loads, (marshal.dumps(code),)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _reduce_code},
                              cloudpickle.Pickler.dispatch_table)


def dumps(value: Any, protocol: int = 5, buffer_callback: Any = None) -> bytes:
    """``cloudpickle.dumps``, with code objects keeping their file names."""
    file = io.BytesIO()
    _Pickler(file, protocol=protocol, buffer_callback=buffer_callback).dump(value)
    return file.getvalue()


#: A remote function or actor class whose pickle is this large is refused (Ray's
#: ``FUNCTION_SIZE_ERROR_THRESHOLD``, read from the same environment variable), and one of
#: a tenth of it is warned about: such a pickle almost always captured a large array from
#: the enclosing scope, and every worker would load it.
def function_size_limits() -> tuple[int, int]:
    import os

    error = int(os.environ.get("FUNCTION_SIZE_ERROR_THRESHOLD", 10**8))
    return error // 10, error


def check_function_size(blob: bytes, what: str) -> None:
    """Refuse (``ValueError``) or warn about the pickle of ``what`` ("remote function
    f", "actor A") when it is too large; called once per function or class."""
    warn_at, error_at = function_size_limits()
    size = len(blob)
    if size < warn_at:
        return
    mib = 1024 * 1024
    advice = ("Check that its definition does not capture a large array or other object "
              "from its scope: put that with lightwork.put() and pass the ref, or build it "
              "inside the function.")
    if size >= error_at:
        raise ValueError(f"The {what} is too large ({size // mib} MiB > "
                         f"FUNCTION_SIZE_ERROR_THRESHOLD={error_at // mib} MiB). {advice}")
    import warnings

    warnings.warn(f"The {what} is very large ({size // mib} MiB). {advice}",
                  UserWarning, stacklevel=4)
