"""Ray's ``ray.actor`` names: ``exit_actor``, ``ActorClass``, ``ActorHandle``, ``ActorMethod``."""

from lightwork.api.actor import ActorClass, ActorHandle, ActorMethod, exit_actor, method

__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "exit_actor", "method"]
