"""``lightwork.exceptions`` (and ``ray.exceptions`` after ``import lightwork as ray``):
the public error types, defined in :mod:`lightwork.kernel.exceptions`."""

from lightwork.kernel.exceptions import *  # noqa: F403 - the public names, listed in __all__
from lightwork.kernel.exceptions import __all__  # noqa: F401
