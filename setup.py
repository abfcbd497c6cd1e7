"""Builds lightwork's one compiled module, ``lightwork._collector`` (see
``src/lightwork/kernel/collector.py``). It is optional: where it cannot be built, the
install goes on and the runtime uses its pure-Python fallback."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("lightwork._collector", ["src/lightwork/_collector.c"],
                             optional=True)])
