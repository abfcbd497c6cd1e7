"""lightwork's test suite, one folder per package of ``src/lightwork``.

``tests`` is a package (so is each folder), so pytest imports every test module by its
full name (``tests.api.test_tasks``): two folders may hold files of the same name, and a
test module imports the shared modules as ``from tests import helpers, support`` or
another test module as ``from tests.diagnostics.test_timeline import load_trace``, the
same from every folder. pytest puts the directory above ``tests/`` on ``sys.path``
(its default ``prepend`` import mode); driver scripts run in subprocesses get it from
``helpers.ALIAS_PRELUDE``.

* ``helpers``: the suite's tools (barriers, gates, driver scripts, ``wait_until``);
* ``support``: the one place tests reach lightwork's internals;
* ``dask_cluster``: a real Dask cluster in subprocesses, for the cluster tests;
* ``conftest.py``: the shared runtimes, the Ray switch, pickling by value.

``docs/`` and ``packaging/`` are folders without ``__init__.py``: their files import
nothing of the suite's.
"""
