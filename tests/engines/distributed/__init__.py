"""Tests of the Dask distributed backend (``lightwork.engines.distributed``) on a real cluster."""
