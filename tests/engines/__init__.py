"""Tests of ``lightwork.engines``."""
