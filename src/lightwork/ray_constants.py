"""``lightwork.ray_constants`` (Ray's ``ray.ray_constants``, in Ray 2 ``ray._private.ray_constants``).

Ray's module holds the settings of its own machinery: GCS key namespaces, error channels,
process types, log formats. Programs and test files import the module for one or two of
them; most mean nothing here. This module exists so that such an import works, and holds
only the constants that have a meaning on lightwork, with lightwork's values; any other
name raises an ``AttributeError`` that says so, at the line that uses it.
"""

from __future__ import annotations

__all__ = ["DEFAULT_DASHBOARD_PORT", "RAY_ADDRESS_ENVIRONMENT_VARIABLE"]

#: The port ``init(dashboard=True)`` / ``lightwork dashboard`` try first (Ray's too).
DEFAULT_DASHBOARD_PORT = 8265
#: The environment variable ``init()`` reads the address of the cluster from, when it is
#: given none (Ray's is ``RAY_ADDRESS``; see ``lightwork.engines``).
RAY_ADDRESS_ENVIRONMENT_VARIABLE = "LIGHTWORK_ADDRESS"


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"ray_constants.{name} is a setting of Ray's own machinery, which lightwork does not "
        f"have; lightwork.ray_constants holds only {', '.join(__all__)}. Remove the use, "
        "or run this program on Ray itself")
