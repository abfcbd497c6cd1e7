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
