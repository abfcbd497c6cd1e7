"""Tests of ``lightwork.diagnostics``: advisor, timeline, stack, callbacks, profilers."""
