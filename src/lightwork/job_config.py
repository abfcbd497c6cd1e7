"""``lightwork.job_config`` (Ray's ``ray.job_config``): ``JobConfig``, for
``init(job_config=...)``. What each field does on lightwork is in
:mod:`lightwork.api.job_config`."""

from lightwork.api.job_config import JobConfig

__all__ = ["JobConfig"]
