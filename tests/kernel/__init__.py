"""Tests of ``lightwork.kernel``: ids, serialization, the event log, the backend interface."""
