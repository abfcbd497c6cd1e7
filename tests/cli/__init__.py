"""Tests of the command line (``lightwork.cli``, ``python -m lightwork run``)."""
