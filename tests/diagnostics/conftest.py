"""The advisor tests' runtime: started by each test with the options it names."""

from __future__ import annotations

import os

import pytest

import lightwork

CPUS = min(2, os.cpu_count() or 1)  # never more slots than cores: no fewer-slots noise


@pytest.fixture
def runtime(fresh_runtime):
    """``runtime(**options)``: a fresh ``init`` with ``num_cpus=CPUS`` unless given."""
    def start(**options):
        lightwork.shutdown()
        lightwork.init(num_cpus=options.pop("num_cpus", CPUS), **options)

    yield start
    lightwork.shutdown()
