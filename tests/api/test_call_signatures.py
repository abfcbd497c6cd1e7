"""Wrong call signatures fail at ``.remote()``, as in Ray.

A missing or extra argument to ``f.remote()``, ``Cls.remote()`` or
``handle.method.remote()`` raises ``TypeError`` in the caller at once, naming the callee
and its signature, instead of failing later in the worker. Nothing is submitted.
"""

from __future__ import annotations

import pytest

import lightwork as ray

pytestmark = pytest.mark.usefixtures("two_cpus")


@ray.remote
def add(x, y=10, *, scale=1):
    return (x + y) * scale


@ray.remote
def anything(*args, **kwargs):
    return len(args), sorted(kwargs)


@ray.remote
def needs_keyword(x, *, mode):
    return x, mode


@ray.remote
class Account:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance

    def deposit(self, amount, note=""):
        self.balance += amount
        return self.balance

    @staticmethod
    def rate(kind):
        return {"basic": 1}[kind]

    @classmethod
    def bank(cls, country):
        return f"{cls.__name__} in {country}"

    async def audit(self, level):
        return level


@pytest.mark.parametrize("call, problem", [
    (lambda: add.remote(), "missing a required argument: 'x'"),
    (lambda: add.remote(1, 2, 3), "too many positional arguments"),
    (lambda: add.remote(1, z=2), "unexpected keyword argument 'z'"),
    (lambda: add.remote(1, x=2), "multiple values for argument 'x'"),
    (lambda: add.options(num_cpus=1).remote(), "missing a required argument: 'x'"),
    (lambda: needs_keyword.remote(1), "missing a required argument: 'mode'"),
])
def test_task_with_wrong_arguments_fails_at_remote(call, problem):
    with pytest.raises(TypeError) as info:
        call()
    assert problem in str(info.value)


@pytest.mark.lightwork_only
def test_task_signature_error_names_the_function_and_its_signature():
    with pytest.raises(TypeError) as info:
        add.remote()
    assert "add(x, y=10, *, scale=1)" in str(info.value)


def test_tasks_with_fitting_arguments_still_run():
    refs = [add.remote(1), add.remote(1, 2), add.remote(x=1, y=2, scale=3),
            anything.remote(1, 2, 3, k=4), needs_keyword.remote(1, mode="m"),
            add.remote(ray.put(5))]
    assert ray.get(refs, timeout=30) == [11, 3, 9, (3, ["k"]), (1, "m"), 15]


@pytest.mark.parametrize("call, problem", [
    (lambda: Account.remote(), "missing a required argument: 'owner'"),
    (lambda: Account.remote("a", 1, 2), "too many positional arguments"),
    (lambda: Account.options(name=None).remote(bonus=1, owner="a"), "unexpected keyword"),
])
def test_actor_constructor_with_wrong_arguments_fails_at_remote(call, problem):
    with pytest.raises(TypeError) as info:
        call()
    assert problem in str(info.value)


def test_actor_methods_with_wrong_arguments_fail_at_remote():
    account = Account.remote("ann")
    wrong = {
        "missing a required argument: 'amount'": lambda: account.deposit.remote(),
        "too many positional arguments": lambda: account.deposit.remote(1, "x", 3),
        "unexpected keyword argument 'memo'": lambda: account.deposit.remote(1, memo="x"),
        "missing a required argument: 'kind'": lambda: account.rate.remote(),
        "too many positional arguments ": lambda: account.bank.remote("fr", "de"),
        "missing a required argument: 'level'": lambda: account.audit.remote(),
    }
    for problem, call in wrong.items():
        with pytest.raises(TypeError) as info:
            call()
        assert problem.strip() in str(info.value), problem
    # None of the wrong calls reached the actor; the right ones work.
    assert ray.get(account.deposit.remote(5), timeout=30) == 5
    assert ray.get([account.rate.remote("basic"), account.bank.remote("fr"),
                    account.audit.remote(2), account.deposit.remote(1, note="n")],
                   timeout=30) == [1, "Account in fr", 2, 6]


@pytest.mark.lightwork_only
def test_actor_method_signature_error_names_the_method():
    account = Account.remote("bob")
    with pytest.raises(TypeError) as info:
        account.deposit.remote()
    assert "Account.deposit(amount, note='')" in str(info.value)


def test_handle_passed_to_a_task_still_reports_wrong_arguments():
    """A handle rebuilt in another process has no class to check against: the error
    comes back from the actor instead, still a TypeError naming the problem."""
    account = Account.remote("cy")

    @ray.remote
    def call_badly(handle):
        return ray.get(handle.deposit.remote())

    with pytest.raises(TypeError) as info:
        ray.get(call_badly.remote(account), timeout=30)
    assert "amount" in str(info.value)


def test_ray_s_older_underscore_remote_takes_args_kwargs_and_options():
    """``_remote(args, kwargs, **options)``, which Ray's own tests and older programs
    call, is ``.options(**options).remote(*args, **kwargs)`` for tasks, actors and
    methods, with the same checks."""
    assert ray.get(add._remote([1], {"scale": 2})) == 22
    first, second = anything._remote(args=[1, 2], kwargs={"k": 3}, num_returns=2,
                                     num_cpus=0)
    assert ray.get(first) == 2 and ray.get(second) == ["k"]
    assert add._remote([1], num_returns=0) is None
    account = Account._remote(args=["ann"], kwargs={"balance": 5}, num_cpus=0)
    assert ray.get(account.deposit._remote(args=[10], kwargs={"note": "pay"})) == 15
    assert ray.get(account.deposit._remote([1])) == 16
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        add._remote()
    with pytest.raises(TypeError, match="too many positional arguments"):
        account.deposit._remote(args=[1, 2, 3])
    with pytest.raises(ValueError):
        add._remote([1], num_returns=-3)
