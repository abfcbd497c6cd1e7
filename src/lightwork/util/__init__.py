"""Utilities with Ray's names: ``ActorPool``."""

from lightwork.util.actor_pool import ActorPool

__all__ = ["ActorPool"]
