"""runtime_env is applied, not ignored: ``env_vars``, a local
``working_dir`` and local ``py_modules`` on tasks, actors and job-wide via ``init``;
nothing leaks into later tasks on the same worker; keys lightwork does not support are
said so; bad values fail at once. Also ``get``/``wait`` of a non-ref raise ValueError.
"""

from __future__ import annotations

import os
import warnings

import pytest

import lightwork as ray


@ray.remote
def read_env(name):
    return os.environ.get(name), os.getpid()


@ray.remote
def where_am_i():
    import sys

    return os.getcwd(), list(sys.path), os.getpid()


@pytest.fixture
def project(tmp_path):
    """A directory with a data file and a module, and a package directory beside it."""
    work = tmp_path / "project"
    work.mkdir()
    (work / "data.txt").write_text("payload\n")
    (work / "wd_helper_mod.py").write_text("ANSWER = 42\n")
    package = tmp_path / "libs" / "rtenv_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("NAME = 'rtenv_pkg'\n")
    single = tmp_path / "single" / "rtenv_single.py"
    single.parent.mkdir()
    single.write_text("NAME = 'single file'\n")
    return work, package, single


@pytest.fixture
def one_worker(fresh_runtime, monkeypatch):
    """One worker process, so a later task runs where the earlier one did."""
    monkeypatch.setenv("LW_RTENV_PRESET", "from the driver")
    ray.init(num_cpus=1)
    yield


def test_task_env_vars_are_applied_and_do_not_leak(one_worker, against_ray):
    with_env = read_env.options(runtime_env={"env_vars": {"LW_RTENV_A": "set"}})
    value, pid = ray.get(with_env.remote("LW_RTENV_A"), timeout=30)
    assert value == "set"
    after, pid_after = ray.get(read_env.remote("LW_RTENV_A"), timeout=30)
    if not against_ray:  # Ray starts a worker per runtime_env; lightwork reuses its one
        assert pid_after == pid
    assert after is None


def test_task_env_var_overriding_an_existing_one_is_restored(one_worker):
    override = {"env_vars": {"LW_RTENV_PRESET": "overridden"}}
    assert ray.get(read_env.options(runtime_env=override).remote("LW_RTENV_PRESET"),
                   timeout=30)[0] == "overridden"
    assert ray.get(read_env.remote("LW_RTENV_PRESET"), timeout=30)[0] == "from the driver"


def test_env_vars_in_the_decorator(one_worker):
    @ray.remote(runtime_env={"env_vars": {"LW_RTENV_DECO": "deco"}})
    def decorated():
        return os.environ.get("LW_RTENV_DECO")

    assert ray.get(decorated.remote(), timeout=30) == "deco"
    assert ray.get(read_env.remote("LW_RTENV_DECO"), timeout=30)[0] is None


@pytest.mark.lightwork_only
def test_working_dir_is_the_cwd_and_importable_then_undone(one_worker, project):
    """More than Ray on purpose: Ray takes local paths only in init(runtime_env=...)."""
    work, _, _ = project

    @ray.remote
    def use_project():
        import wd_helper_mod

        with open("data.txt") as f:
            return wd_helper_mod.ANSWER, f.read().strip()

    options = {"runtime_env": {"working_dir": str(work)}}
    assert ray.get(use_project.options(**options).remote(), timeout=30) == (42, "payload")
    cwd, path, _ = ray.get(where_am_i.remote(), timeout=30)
    assert cwd != str(work)
    assert str(work) not in path


@pytest.mark.lightwork_only
def test_relative_working_dir_is_resolved_in_the_driver(one_worker, project, monkeypatch):
    """More than Ray on purpose: Ray takes local paths only in init(runtime_env=...)."""
    work, _, _ = project
    monkeypatch.chdir(work.parent)

    @ray.remote
    def read_data():
        with open("data.txt") as f:
            return f.read().strip()

    assert ray.get(read_data.options(runtime_env={"working_dir": "project"}).remote(),
                   timeout=30) == "payload"


@pytest.mark.lightwork_only
def test_py_modules_make_local_packages_and_files_importable(one_worker, project):
    """More than Ray on purpose: Ray takes local paths only in init(runtime_env=...)."""
    _, package, single = project

    @ray.remote
    def names():
        import rtenv_pkg
        import rtenv_single

        return rtenv_pkg.NAME, rtenv_single.NAME

    options = {"runtime_env": {"py_modules": [str(package), str(single)]}}
    assert ray.get(names.options(**options).remote(), timeout=30) == ("rtenv_pkg", "single file")


@pytest.mark.lightwork_only
def test_actor_runtime_env_holds_for_its_life_and_not_for_tasks(one_worker, project):
    """More than Ray on purpose: Ray takes local paths only in init(runtime_env=...)."""
    work, _, _ = project

    @ray.remote
    class Reader:
        def env(self, name):
            return os.environ.get(name)

        def data(self):
            with open("data.txt") as f:
                return f.read().strip()

    reader = Reader.options(runtime_env={
        "env_vars": {"LW_RTENV_ACTOR": "actor"}, "working_dir": str(work)}).remote()
    assert ray.get([reader.env.remote("LW_RTENV_ACTOR"), reader.data.remote(),
                    reader.env.remote("LW_RTENV_ACTOR")], timeout=30) == ["actor", "payload", "actor"]
    assert ray.get(read_env.remote("LW_RTENV_ACTOR"), timeout=30)[0] is None


def test_init_runtime_env_is_the_job_default(fresh_runtime, project):
    work, package, _ = project
    ray.init(num_cpus=1, runtime_env={
        "env_vars": {"LW_RTENV_JOB": "job", "LW_RTENV_BOTH": "job"},
        "working_dir": str(work), "py_modules": [str(package)]})

    @ray.remote
    def job_view():
        import rtenv_pkg

        with open("data.txt") as f:
            return (os.environ.get("LW_RTENV_JOB"), os.environ.get("LW_RTENV_BOTH"),
                    f.read().strip(), rtenv_pkg.NAME)

    assert ray.get(job_view.remote(), timeout=30) == ("job", "job", "payload", "rtenv_pkg")
    # A task's own env goes on top of the job's, and the job's comes back after it.
    on_top = job_view.options(runtime_env={"env_vars": {"LW_RTENV_BOTH": "task"}})
    assert ray.get(on_top.remote(), timeout=30) == ("job", "task", "payload", "rtenv_pkg")
    assert ray.get(job_view.remote(), timeout=30)[1] == "job"

    @ray.remote
    class JobActor:
        def view(self):
            with open("data.txt") as f:  # Ray runs in a copy of working_dir, lightwork in it
                return os.environ.get("LW_RTENV_JOB"), f.read().strip()

    assert ray.get(JobActor.remote().view.remote(), timeout=30) == ("job", "payload")


@pytest.mark.lightwork_only
def test_unsupported_keys_warn_once_and_the_task_still_runs(one_worker):
    from lightwork.kernel import runtime_env

    runtime_env._warned.discard("runtime_env:conda")
    with pytest.warns(ray.exceptions.RuntimeEnvWarning, match=r"runtime_env\['conda'\].*not supported"):
        opted = read_env.options(runtime_env={"conda": "myenv", "env_vars": {"LW_RTENV_C": "c"}})
    assert ray.get(opted.remote("LW_RTENV_C"), timeout=30)[0] == "c"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second use says nothing more
        read_env.options(runtime_env={"conda": "myenv"})


@pytest.mark.lightwork_only
def test_unsupported_key_in_init_warns(fresh_runtime):
    from lightwork.kernel import runtime_env

    runtime_env._warned.discard("runtime_env:container")
    with pytest.warns(ray.exceptions.RuntimeEnvWarning, match="container"):
        ray.init(num_cpus=1, runtime_env={"container": {"image": "x"}})
    assert ray.get(read_env.remote("HOME"), timeout=30)[0] == os.environ.get("HOME")


@pytest.mark.lightwork_only
@pytest.mark.parametrize("runtime_env, error, words", [
    ("env_vars=1", TypeError, "must be a dict"),
    ({"env_vars": {"N": 4}}, TypeError, "str to str"),
    ({"env_vars": ["N"]}, TypeError, "str to str"),
    ({"working_dir": "/no/such/dir/anywhere"}, ValueError, "not an existing directory"),
    ({"working_dir": "s3://bucket/code.zip"}, ValueError, "local directory"),
    ({"py_modules": ["https://example.com/pkg.whl"]}, ValueError, "local"),
    ({"py_modules": "/tmp"}, TypeError, "must be a list"),
    ({"py_modules": ["/no/such/module"]}, ValueError, "does not exist"),
])
def test_bad_runtime_env_fails_at_options_naming_the_problem(runtime_env, error, words):
    with pytest.raises(error, match=words):
        read_env.options(runtime_env=runtime_env)

    class Plain:
        pass

    with pytest.raises(error, match=words):
        ray.remote(Plain).options(runtime_env=runtime_env)


@pytest.mark.lightwork_only
def test_bad_runtime_env_in_init_starts_nothing(fresh_runtime):
    with pytest.raises(TypeError, match="str to str"):
        ray.init(num_cpus=1, runtime_env={"env_vars": {"N": 1}})
    assert not ray.is_initialized()


def test_get_of_a_non_ref_raises_value_error(fresh_runtime):
    with pytest.raises(ValueError):
        ray.get(123)
    with pytest.raises(ValueError):
        ray.get("not a ref")


@pytest.mark.lightwork_only
def test_non_refs_in_get_and_wait_are_both_value_and_type_errors(fresh_runtime):
    """Stricter on purpose: Ray raises TypeError for wait() and for a list holding a
    non-ref; lightwork's error is both, so Ray code catching either keeps working."""
    for call in (lambda: ray.get(123), lambda: ray.get([1]), lambda: ray.wait(123),
                 lambda: ray.wait([1, 2])):
        with pytest.raises(ValueError) as info:
            call()
        assert isinstance(info.value, TypeError)
        assert "ObjectRef" in str(info.value)
    assert not ray.is_initialized()  # a bad argument starts no runtime


def test_generator_task_sees_its_env_at_every_item_and_leaves_none(one_worker):
    @ray.remote
    def stream(count):
        for _ in range(count):
            yield os.environ.get("LW_RTENV_GEN")

    refs = stream.options(runtime_env={"env_vars": {"LW_RTENV_GEN": "g"}}).remote(3)
    assert [ray.get(ref, timeout=30) for ref in refs] == ["g", "g", "g"]
    assert ray.get(read_env.remote("LW_RTENV_GEN"), timeout=30)[0] is None
