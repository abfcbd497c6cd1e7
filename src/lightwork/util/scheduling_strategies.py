"""``ray.util.scheduling_strategies``: where a task or actor runs.

Defined in :mod:`lightwork.api.scheduling_strategies`; this module is its public name.
"""

from lightwork.api.scheduling_strategies import *  # noqa: F403
from lightwork.api.scheduling_strategies import __all__  # noqa: F401
