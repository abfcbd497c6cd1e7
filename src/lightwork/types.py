"""``lightwork.types`` (Ray's ``ray.types``): the names Ray keeps there for annotations,
``ObjectRef`` (subscriptable: ``ObjectRef[np.ndarray]``), the same class as
``lightwork.ObjectRef``."""

from lightwork.kernel.object_ref import ObjectRef

__all__ = ["ObjectRef"]
