"""Run as a script: the dashboard process, without importing the lightwork runtime.

``launch.start`` (``init(dashboard=True)``) and ``lightwork dashboard`` (which replaces
its process with this one once it found the session) run
``python .../lightwork/dashboard/_serve.py ARGS``. Importing ``lightwork`` runs its
``__init__``, which loads the whole runtime (its scheduler, cloudpickle, the API: about
25 MB and 0.2 s) that the dashboard process never uses: it reads the program through
the control socket. So this script registers a bare ``lightwork`` package (its
``__path__`` only) before importing ``lightwork.dashboard``: submodules import as usual,
and the server pulls in only what it uses (the control socket's client, the mirror,
the HTTP server). A view that needs more (the trace download, stack formatting) imports
it on first use.
"""

import os
import sys
import types


def _bare_package() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]  # the script's folder: its modules are not top-level modules
    package_dir = os.path.dirname(here)
    package = types.ModuleType("lightwork", "lightwork, its package only (the dashboard)")
    package.__path__ = [package_dir]
    package.__file__ = os.path.join(package_dir, "__init__.py")
    package.BARE_PACKAGE = True  # type: ignore[attr-defined]  # read by run_command
    sys.modules["lightwork"] = package


if __name__ == "__main__":
    _bare_package()
    from lightwork.dashboard import serve_main

    raise SystemExit(serve_main(sys.argv[1:]))
