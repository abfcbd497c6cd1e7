"""``lightwork.cloudpickle`` (Ray's ``ray.cloudpickle``): the pickler lightwork ships
functions, classes and values with.

It is the ``cloudpickle`` package (a dependency of lightwork): every public name of it is
here, and any other attribute is looked up on it. ``dumps`` and ``dump`` are lightwork's
own (:func:`lightwork.kernel.pickler.dumps`): the same format, except that code pickled by
value keeps its file name, so a traceback from it names the user's file (why: see
``kernel/pickler.py``). ``loads`` and ``load`` are the standard ones. An ``ObjectRef``
pickled with it and loaded again in the same session is a working ref.
"""

from __future__ import annotations

import pickle as _pickle
from typing import IO, Any

import cloudpickle as _cloudpickle
from cloudpickle import (
    CloudPickler,
    Pickler,
    load,
    loads,
    register_pickle_by_value,
    unregister_pickle_by_value,
)

from lightwork.kernel import pickler as _pickler

__version__ = _cloudpickle.__version__

__all__ = ["CloudPickler", "Pickler", "__version__", "dump", "dumps", "load", "loads",
           "register_pickle_by_value", "unregister_pickle_by_value"]

DEFAULT_PROTOCOL: int = getattr(_cloudpickle, "DEFAULT_PROTOCOL", _pickle.HIGHEST_PROTOCOL)


def dumps(obj: Any, protocol: int | None = None, buffer_callback: Any = None) -> bytes:
    """``obj`` as a cloudpickle (code by value keeps its file name)."""
    return _pickler.dumps(obj, protocol=DEFAULT_PROTOCOL if protocol is None else protocol,
                          buffer_callback=buffer_callback)


def dump(obj: Any, file: IO[bytes], protocol: int | None = None,
         buffer_callback: Any = None) -> None:
    """Write ``dumps(obj)`` to the binary file ``file``."""
    file.write(dumps(obj, protocol, buffer_callback))


def __getattr__(name: str) -> Any:
    # The rest of cloudpickle (e.g. its `cloudpickle` submodule), as in Ray's copy of it.
    try:
        return getattr(_cloudpickle, name)
    except AttributeError:
        raise AttributeError(
            f"module 'lightwork.cloudpickle' has no attribute {name!r} (neither has the "
            f"cloudpickle {__version__} package it is)") from None
