"""``ray.util.placement_group``: reserve bundles of resources, then place tasks in them.

Defined in :mod:`lightwork.api.placement_group`; this module is its public name.
"""

from lightwork.api.placement_group import *  # noqa: F403
from lightwork.api.placement_group import __all__  # noqa: F401
