"""Tests of ``lightwork.dask``: the Dask scheduler."""
