"""Tests of the local engine (``lightwork.engines.local``): scheduler, store, workers, I/O loop."""
