"""``lightwork.runtime_context`` (Ray's ``ray.runtime_context``): ``get_runtime_context()``
and the ``RuntimeContext`` it returns (ids, resources and namespace of the caller), the
same objects as ``lightwork.get_runtime_context``."""

from lightwork.api.core import RuntimeContext, get_runtime_context

__all__ = ["RuntimeContext", "get_runtime_context"]
