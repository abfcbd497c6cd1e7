"""Tests of ``lightwork.dashboard``."""
