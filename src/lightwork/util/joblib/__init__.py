"""``ray.util.joblib``: joblib's ``"ray"`` backend, on lightwork tasks.

::

    from lightwork.util.joblib import register_ray
    register_ray()
    with joblib.parallel_backend("ray"):
        search.fit(X, y)   # scikit-learn's n_jobs work runs as lightwork tasks

``register_ray()`` registers :class:`~lightwork.util.joblib.backend.LightworkBackend`
under the names ``"ray"`` and ``"lightwork"``. joblib is an optional dependency (the
``joblib`` extra): this module imports without it, and ``register_ray()`` says what to
install when it is missing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register_ray"]

BACKEND_NAMES = ("ray", "lightwork")


def register_ray() -> None:
    """Register the lightwork backend as joblib's ``"ray"`` (and ``"lightwork"``) backend."""
    try:
        from joblib.parallel import register_parallel_backend
    except ImportError:
        raise ImportError(
            "ray.util.joblib.register_ray() needs joblib, which is not installed: "
            "pip install 'lightwork[joblib]' (or pip install joblib)") from None
    from lightwork.util.joblib.backend import LightworkBackend

    for name in BACKEND_NAMES:
        register_parallel_backend(name, LightworkBackend)


def __getattr__(name: str) -> Any:
    if name in ("LightworkBackend", "RayBackend"):  # RayBackend: Ray's name for it
        from lightwork.util.joblib.backend import LightworkBackend

        return LightworkBackend
    raise AttributeError(f"module 'lightwork.util.joblib' has no attribute {name!r}")
