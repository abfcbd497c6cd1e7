"""Tests of ``lightwork.util``."""
