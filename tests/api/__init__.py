"""Tests of ``lightwork.api``: tasks, actors, objects, errors, cancel and init."""
