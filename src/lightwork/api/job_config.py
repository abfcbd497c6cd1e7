"""``JobConfig``: Ray's job-wide settings, as far as one lightwork session can honour them.

``init(job_config=JobConfig(...))`` reads it once, at the start of the session
(:func:`session_settings`); what each field does here:

* ``runtime_env``: the job's runtime_env, used when ``init`` gets none itself (Ray: an
  ``init(runtime_env=...)`` replaces the job config's);
* ``ray_namespace``: the session's namespace, unless ``init(namespace=...)`` names one;
* ``code_search_path``: directories put first on ``sys.path`` in every worker (Ray's
  meaning for Python workers), through the job's runtime_env; an entry that is not an
  existing directory (a Java ``.jar``) is an error, since lightwork runs Python workers only;
* ``default_actor_lifetime="detached"``: named actors that the driver creates without a
  ``lifetime`` are detached (kept until ``kill``/``shutdown`` after their handles are
  gone). Unnamed actors are not (lightwork's detached actors need a name, so they can be
  found again), nor are actors created inside a task or an actor (they do not see the
  driver's JobConfig);
* ``metadata``: kept on the object, shown nowhere (lightwork has no job table);
* ``jvm_options``: ignored with an ``IgnoredOptionWarning`` (there are no Java workers).

A detached actor still ends with the session: the embedded runtime lives in the driver's
process, and on a cluster lightwork ends what the driver made when it disconnects, unless
the actor was published (see ``docs/cluster.md``).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["JobConfig"]

_LIFETIMES = ("detached", "non_detached")


class JobConfig:
    """The settings of one job (one driver's session); pass it as ``init(job_config=...)``."""

    def __init__(
        self,
        jvm_options: list[str] | None = None,
        code_search_path: list[str] | tuple[str, ...] | None = None,
        runtime_env: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
        ray_namespace: str | None = None,
        default_actor_lifetime: str = "non_detached",
    ) -> None:
        self.jvm_options = _string_list("jvm_options", jvm_options)
        self.code_search_path = _string_list("code_search_path", code_search_path)
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"JobConfig(metadata=...) must be a dict of str to str, got "
                            f"{type(metadata).__name__}")
        self.metadata: dict[str, str] = {}
        for key, value in (metadata or {}).items():
            self.set_metadata(key, value)
        self.ray_namespace: str | None = None
        if ray_namespace is not None:
            self.set_ray_namespace(ray_namespace)
        self.set_runtime_env(runtime_env)
        self.set_default_actor_lifetime(default_actor_lifetime)

    def set_metadata(self, key: str, value: str) -> None:
        """Set one metadata entry (kept on this object; lightwork shows it nowhere)."""
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"JobConfig metadata keys and values must be strings, got "
                            f"{key!r}: {value!r}")
        self.metadata[key] = value

    def set_runtime_env(self, runtime_env: dict[str, Any] | None,
                        validate: bool = False) -> None:
        """Set the job's runtime_env; ``validate=True`` checks it now instead of at ``init``."""
        if runtime_env is not None and not isinstance(runtime_env, dict):
            raise TypeError(f"JobConfig(runtime_env=...) must be a dict such as "
                            f"{{'env_vars': {{'NAME': 'value'}}}}, got "
                            f"{type(runtime_env).__name__}")
        if validate:
            from lightwork.kernel.runtime_env import normalize

            normalize(runtime_env, "JobConfig")
        self.runtime_env: dict[str, Any] = dict(runtime_env or {})

    def set_ray_namespace(self, ray_namespace: str) -> None:
        """Set the namespace of the job's named actors."""
        if not isinstance(ray_namespace, str) or not ray_namespace:
            raise ValueError(f"JobConfig ray_namespace must be a non-empty string, got "
                             f"{ray_namespace!r}")
        self.ray_namespace = ray_namespace

    def set_default_actor_lifetime(self, default_actor_lifetime: str) -> None:
        """``"detached"`` or ``"non_detached"``: the lifetime of named actors created
        without one (see the module docstring)."""
        if default_actor_lifetime not in _LIFETIMES:
            raise ValueError(f"default_actor_lifetime must be 'detached' or 'non_detached', "
                             f"got {default_actor_lifetime!r}")
        self.default_actor_lifetime = default_actor_lifetime

    @classmethod
    def from_json(cls, job_config_json: dict[str, Any]) -> JobConfig:
        """A JobConfig from a dict of its fields (Ray's JSON form; unknown keys ignored)."""
        if not isinstance(job_config_json, dict):
            raise TypeError(f"JobConfig.from_json takes a dict, got "
                            f"{type(job_config_json).__name__}")
        return cls(
            jvm_options=job_config_json.get("jvm_options"),
            code_search_path=job_config_json.get("code_search_path"),
            runtime_env=job_config_json.get("runtime_env"),
            metadata=job_config_json.get("metadata"),
            ray_namespace=job_config_json.get("ray_namespace"),
            default_actor_lifetime=job_config_json.get("default_actor_lifetime",
                                                       "non_detached"),
        )

    def __repr__(self) -> str:
        fields = {k: v for k, v in vars(self).items() if v not in (None, [], {})}
        return f"JobConfig({', '.join(f'{k}={v!r}' for k, v in fields.items())})"


def _string_list(field: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"JobConfig({field}=...) must be a list of strings, got {value!r}")
    return list(value)


def session_settings(job_config: Any, runtime_env: dict[str, Any] | None,
                     namespace: str | None) -> tuple[dict[str, Any] | None, str | None, list[str]]:
    """What ``init`` takes from ``job_config``: (runtime_env, namespace, directories to put
    on the workers' ``sys.path``), with ``init``'s own arguments first."""
    if job_config is None:
        return runtime_env, namespace, []
    if not isinstance(job_config, JobConfig):
        raise TypeError(f"init(job_config=...) must be a lightwork.job_config.JobConfig "
                        f"(ray.job_config.JobConfig), got {type(job_config).__name__}")
    if job_config.jvm_options:
        from lightwork.kernel.exceptions import IgnoredOptionWarning
        from lightwork.kernel.runtime_env import warn_once

        warn_once("job_config:jvm_options",
                  "JobConfig(jvm_options=...) is ignored: lightwork runs Python workers only "
                  "(no Java workers to pass JVM options to)", IgnoredOptionWarning)
    paths = []
    for entry in job_config.code_search_path:
        path = os.path.abspath(entry)
        if not os.path.isdir(path):
            raise ValueError(
                f"JobConfig(code_search_path=...) entry {entry!r} is not an existing "
                f"directory (resolved to {path}): lightwork runs Python workers only and puts "
                "each directory on their sys.path; remove .jar files and fix the path")
        paths.append(path)
    if runtime_env is None and job_config.runtime_env:
        runtime_env = job_config.runtime_env
    if namespace is None:
        namespace = job_config.ray_namespace
    return runtime_env, namespace, paths


# The session's lifetime for named actors created without one: set by init from the
# JobConfig, cleared by shutdown (the driver's; actors created inside tasks do not see it).
_default_lifetime: str | None = None


def set_default_actor_lifetime(job_config: Any) -> None:
    global _default_lifetime
    lifetime = getattr(job_config, "default_actor_lifetime", None)
    _default_lifetime = "detached" if lifetime == "detached" else None


def default_actor_lifetime() -> str | None:
    """``"detached"`` when the session's JobConfig asked for it, else None."""
    return _default_lifetime
