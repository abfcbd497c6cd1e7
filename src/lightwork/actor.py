"""Ray's ``ray.actor`` names: ``exit_actor``, ``ActorClass``, ``ActorHandle``, ``ActorMethod``
and ``ActorClassInheritanceException``."""

from lightwork.api.actor import (ActorClass, ActorClassInheritanceException, ActorHandle,
                                 ActorMethod, exit_actor, method)

__all__ = ["ActorClass", "ActorClassInheritanceException", "ActorHandle", "ActorMethod",
           "exit_actor", "method"]
