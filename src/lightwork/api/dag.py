"""Lazy task graphs: Ray's DAG API (``f.bind(...)``, ``InputNode``, ``dag.execute()``).

``f.bind(*args)`` (``Cls.bind``, ``handle.method.bind``, and the same after
``.options(...)``) does not run anything: it returns a *node* that remembers the callee,
its options and its arguments, some of which may be other nodes. ``node.execute(...)``
submits the whole graph below ``node`` with the ordinary ``.remote()`` calls and returns
what ``.remote()`` would: an ``ObjectRef`` (a list of them for ``num_returns`` > 1, or
``MultiOutputNode``'s list), or an actor handle for a ``ClassNode``. So a graph runs on
any backend, and every diagnostic sees plain tasks and actor calls.

The nodes:

* ``FunctionNode``: a remote function's call; ``ClassNode``: an actor's creation;
  ``ClassMethodNode``: a method call on the actor a ``ClassNode`` makes, or on a live
  handle;
* ``InputNode``: the value given to ``execute``; ``InputAttributeNode``
  (``inp[0]``, ``inp["k"]``, ``inp.x``): a part of it. ``execute(v)`` gives ``v`` itself;
  ``execute(a, b, k=c)`` gives ``inp[0] == a``, ``inp[1] == b`` and ``inp.k == inp["k"] == c``;
* ``MultiOutputNode([n1, n2])``: several results at once, as a list.

Execution (``execute``). The graph below the root is walked once, children first
(iteratively: a chain of thousands of nodes does not hit the recursion limit), and each
node runs once per ``execute``: a node that two others depend on is submitted once and
both get its ref (a shared subgraph). A node found in an argument, directly or inside
a list, tuple, dict or set, is replaced by its result: directly, the task gets the value
(Ray resolves a ref argument); inside a container, it gets the ref, as with ``.remote()``.
Every ``execute`` submits anew: a ``ClassNode`` starts a new actor each time. Calls bound
on one ``ClassNode`` are submitted in the order they were bound (each remembers the one
before it), so the actor runs them in that order.

Misuse fails at once with a message: arguments that do not fit the callee's signature
(at ``bind``), an ``InputNode`` in an actor's constructor (it is not known when the actor
is made), ``execute`` arguments for a graph without an ``InputNode`` (or none for a graph
with one), two ``InputNode``\\ s in one graph, ``.remote()`` on a node, a node sent to a
task inside an object other than those containers.

Nodes are plain objects of the caller's process and hold no runtime state; they can be
built before ``init()`` (``execute`` starts the runtime as any call does).
"""

from __future__ import annotations

import abc
from typing import Any

from lightwork.kernel.calls import ArgumentCheck


class DAGNode(abc.ABC):
    """A node of a lazy graph: a call bound to its arguments, run by ``execute()``."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any]) -> None:
        self._bound_args = tuple(args)
        self._bound_kwargs = dict(kwargs)
        self._bound_options = dict(options)

    # -- what the node holds (Ray's accessors) -------------------------------------------
    def get_args(self) -> tuple[Any, ...]:
        return self._bound_args

    def get_kwargs(self) -> dict[str, Any]:
        return self._bound_kwargs

    def get_options(self) -> dict[str, Any]:
        return self._bound_options

    def _dependencies(self) -> list[DAGNode]:
        """The nodes this one needs run first: those in its arguments (at any depth of
        the containers ``_replace`` rebuilds), and any a subclass adds."""
        found: list[DAGNode] = []
        _find_nodes((self._bound_args, self._bound_kwargs), found)
        return found

    # -- running ---------------------------------------------------------------------------
    def execute(self, *args: Any, **kwargs: Any) -> Any:
        """Submit the graph below this node; what ``.remote()`` returns for this node.

        ``args``/``kwargs`` are the graph's input (its ``InputNode``): one value, or
        several (``inp[i]`` and ``inp.name`` then pick them)."""
        order = _children_first(self)
        inputs = [node for node in order if type(node) is InputNode]
        if len(inputs) > 1:
            raise ValueError(
                f"this graph has {len(inputs)} different InputNodes; a graph takes one input: "
                "create one InputNode (`with InputNode() as inp:`) and bind every part of "
                "the graph to it (use inp[0], inp[1], inp.name for several values)")
        if not inputs and (args or kwargs):
            raise TypeError(
                f"this graph has no InputNode, so execute() takes no arguments (got "
                f"{len(args)} positional and {len(kwargs)} keyword); bind the values "
                "instead, or build the graph inside `with InputNode() as inp:` and bind inp")
        if inputs and not args and not kwargs:
            raise TypeError(
                "this graph reads an InputNode, so execute() needs its input: "
                "execute(value), or execute(a, b, key=c) for inp[0], inp[1] and inp.key")
        from lightwork.api.remote_function import callsite

        site = callsite(1)  # the user's execute() line: the tasks' call site
        results: dict[int, Any] = {}
        for node in order:
            results[id(node)] = node._run(results, args, kwargs, site)
        return results[id(self)]

    @abc.abstractmethod
    def _run(self, results: dict[int, Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], site: tuple[str, int, str]) -> Any:
        """This node's value in one ``execute``, from ``results`` of the nodes before it
        (by ``id``) and the execute's ``args``/``kwargs``; its tasks are recorded at
        ``site``, the user's ``execute()`` line."""

    def _resolved(self, results: dict[int, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (tuple(_replace(arg, results) for arg in self._bound_args),
                {key: _replace(value, results) for key, value in self._bound_kwargs.items()})

    # -- misuse ----------------------------------------------------------------------------
    def remote(self, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError(
            f".remote() cannot be used on a graph node ({self!r}): run the graph with "
            ".execute(), which returns the refs")

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError(
            f".bind() cannot be used on a graph node ({self!r}): bind the remote function "
            "or actor class, and pass this node as one of its arguments")

    def __reduce__(self) -> Any:
        raise TypeError(
            f"a graph node ({self!r}) cannot be sent to a task or pickled: bind it as an "
            "argument itself, or inside a list, tuple, dict or set, and execute() replaces "
            "it with its result")


class FunctionNode(DAGNode):
    """``f.bind(...)``: a remote function's call."""

    def __init__(self, function: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any], target: Any = None) -> None:
        _check(ArgumentCheck(function._function, function.__qualname__), args, kwargs)
        self._body = function
        self._target = function if target is None else target  # what .remote() is called on
        super().__init__(args, kwargs, options)

    def _run(self, results: dict[int, Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], site: tuple[str, int, str]) -> Any:
        from lightwork.api.remote_function import submit_at

        call_args, call_kwargs = self._resolved(results)
        return submit_at(self._target, call_args, call_kwargs, site)

    def __repr__(self) -> str:
        return f"FunctionNode({self._body.__qualname__})"


class ClassNode(DAGNode):
    """``Cls.bind(...)``: an actor's creation; ``node.method.bind(...)`` calls it."""

    def __init__(self, actor_class: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any], target: Any = None) -> None:
        _check(actor_class._argument_checks()["__init__"], args, kwargs)
        self._body = actor_class
        self._target = actor_class if target is None else target  # what .remote() is called on
        self._last_call: ClassMethodNode | None = None
        super().__init__(args, kwargs, options)
        if any(type(node) in (InputNode, InputAttributeNode)
               for node in _children_first(self)):
            raise ValueError(
                f"an InputNode cannot be an argument of an actor's constructor "
                f"({actor_class.__qualname__}.bind): the input is known only at execute(), "
                "after the actor is made; pass it to a method instead "
                "(node.method.bind(inp))")

    def __getattr__(self, name: str) -> _UnboundMethod:
        body = self.__dict__.get("_body")
        if body is None or name.startswith("__"):
            raise AttributeError(name)
        if name not in body._methods:
            raise AttributeError(
                f"actor class {body.__qualname__} has no method {name!r} to bind")
        return _UnboundMethod(self, name, {})

    def _run(self, results: dict[int, Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], site: tuple[str, int, str]) -> Any:
        call_args, call_kwargs = self._resolved(results)
        return self._target.remote(*call_args, **call_kwargs)

    def __repr__(self) -> str:
        return f"ClassNode({self._body.__qualname__})"


class _UnboundMethod:
    """``class_node.method``: ``.bind(...)`` makes the call's node."""

    def __init__(self, actor: ClassNode, name: str, options: dict[str, Any]) -> None:
        self._actor = actor
        self._name = name
        self._options = options

    def options(self, **options: Any) -> _UnboundMethod:
        return _UnboundMethod(self._actor, self._name, {**self._options, **options})

    def bind(self, *args: Any, **kwargs: Any) -> ClassMethodNode:
        check = self._actor._body._argument_checks().get(self._name)
        if check is not None:
            _check(check, args, kwargs)
        node = ClassMethodNode(self._actor, self._name, args, kwargs, self._options,
                               previous=self._actor._last_call)
        self._actor._last_call = node
        return node

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError(
            f".remote() cannot be used on {self._name} of an actor that is not made yet "
            f"({self._actor!r}): use .bind() to add the call to the graph, then execute()")


class ClassMethodNode(DAGNode):
    """``class_node.method.bind(...)`` or ``handle.method.bind(...)``: an actor call."""

    def __init__(self, actor: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                 options: dict[str, Any], previous: ClassMethodNode | None = None) -> None:
        # ``actor``: a ClassNode (its actor is made by the same execute) or an ActorMethod
        # of a live handle (the method itself: a method holds what a call needs).
        self._actor = actor
        self._method_name = name
        self._previous = previous  # the call bound before it on the same ClassNode
        super().__init__(args, kwargs, options)

    def _dependencies(self) -> list[DAGNode]:
        found = super()._dependencies()
        if isinstance(self._actor, ClassNode):
            found.append(self._actor)
        if self._previous is not None:
            found.append(self._previous)
        return found

    def get_method_name(self) -> str:
        return self._method_name

    def _run(self, results: dict[int, Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], site: tuple[str, int, str]) -> Any:
        call_args, call_kwargs = self._resolved(results)
        if isinstance(self._actor, ClassNode):
            method = getattr(results[id(self._actor)], self._method_name)
        else:
            method = self._actor
        if self._bound_options:
            method = method.options(**self._bound_options)
        return method._submit_at(call_args, call_kwargs, site)

    def __repr__(self) -> str:
        return f"ClassMethodNode({self._method_name}())"


class InputNode(DAGNode):
    """The graph's input: what ``execute(...)`` is given (one graph, one InputNode).

    ``with InputNode() as inp:`` (or plain ``inp = InputNode()``); ``inp[0]``,
    ``inp["key"]`` and ``inp.key`` are parts of it."""

    def __init__(self, *args: Any, input_type: Any = None, **kwargs: Any) -> None:
        if args or kwargs:
            raise ValueError(
                "InputNode() takes no arguments: the input is given to execute(...), "
                "as in dag.execute(value)")
        self.input_type = input_type
        self._parts: dict[tuple[str, Any], InputAttributeNode] = {}
        super().__init__((), {}, {})

    def __enter__(self) -> InputNode:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __getitem__(self, key: int | str) -> InputAttributeNode:
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(
                f"an InputNode is indexed by an int (a positional input) or a str (a keyword "
                f"input, or a key of the one input), not {type(key).__name__}: {key!r}")
        return self._part("item", key)

    def __getattr__(self, name: str) -> InputAttributeNode:
        if name.startswith("_") or "_parts" not in self.__dict__:
            raise AttributeError(name)
        return self._part("attribute", name)

    def _part(self, how: str, key: Any) -> InputAttributeNode:
        part = self._parts.get((how, key))
        if part is None:
            part = self._parts[(how, key)] = InputAttributeNode(self, key, how)
        return part

    def _run(self, results: dict[int, Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], site: tuple[str, int, str]) -> Any:
        if len(args) == 1 and not kwargs:
            return args[0]
        return DAGInputData(*args, **kwargs)

    def __repr__(self) -> str:
        return "InputNode()"


class InputAttributeNode(DAGNode):
    """``inp[key]`` or ``inp.key``: one part of the graph's input."""

    def __init__(self, input_node: InputNode, key: Any, how: str) -> None:
        self._input = input_node
        self._key = key
        self._how = how  # "item" (inp[key]) or "attribute" (inp.key)
        super().__init__((), {}, {})

    @property
    def key(self) -> Any:
        return self._key

    def _dependencies(self) -> list[DAGNode]:
        return [self._input]

    def _run(self, results: dict[int, Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], site: tuple[str, int, str]) -> Any:
        value = results[id(self._input)]
        key = self._key
        if type(value) is DAGInputData:
            return value[key]
        try:
            return getattr(value, key) if self._how == "attribute" else value[key]
        except (LookupError, AttributeError, TypeError) as missing:
            raise type(missing)(
                f"the graph reads {self!r} of its input, but execute() was given "
                f"{type(value).__name__} {value!r:.80}, which has none: {missing}") from None

    def __repr__(self) -> str:
        return f"InputNode().{self._key}" if self._how == "attribute" else f"InputNode()[{self._key!r}]"


class MultiOutputNode(DAGNode):
    """Several nodes' results at once: ``execute()`` returns them as a list."""

    def __init__(self, nodes: list[DAGNode] | tuple[DAGNode, ...]) -> None:
        if not isinstance(nodes, (list, tuple)):
            raise TypeError(
                f"MultiOutputNode takes a list of graph nodes, got {type(nodes).__name__}")
        for index, node in enumerate(nodes):
            if not isinstance(node, DAGNode):
                raise TypeError(
                    f"MultiOutputNode takes graph nodes (made by .bind()), but item {index} "
                    f"is {type(node).__name__}: {node!r:.80}")
        super().__init__(tuple(nodes), {}, {})

    def _run(self, results: dict[int, Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], site: tuple[str, int, str]) -> Any:
        return [results[id(node)] for node in self._bound_args]

    def __repr__(self) -> str:
        return f"MultiOutputNode({len(self._bound_args)} nodes)"


class DAGInputData:
    """The input of ``execute(a, b, key=c)``: ``[0]``/``[1]`` the positional values,
    ``["key"]`` (or ``.key`` on the InputNode) the keyword ones."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = list(args)
        self._kwargs = kwargs

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, int):
            if not -len(self._args) <= key < len(self._args):
                raise IndexError(
                    f"the graph reads positional input {key}, but execute() was given "
                    f"{len(self._args)} positional argument(s)")
            return self._args[key]
        if key not in self._kwargs:
            raise KeyError(
                f"the graph reads input {key!r}, but execute() was given no keyword "
                f"argument of that name (it got: {sorted(self._kwargs) or 'none'})")
        return self._kwargs[key]


# -- the walks ----------------------------------------------------------------------------
def _children_first(root: DAGNode) -> list[DAGNode]:
    """Every node below ``root`` and ``root`` itself, each after the nodes it needs."""
    order: list[DAGNode] = []
    done: set[int] = set()
    stack: list[tuple[DAGNode, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if expanded:
            done.add(id(node))
            order.append(node)
            continue
        stack.append((node, True))
        for child in reversed(node._dependencies()):
            if id(child) not in done:
                stack.append((child, False))
    return order


_CONTAINERS = (list, tuple, dict, set, frozenset)


def _find_nodes(value: Any, found: list[DAGNode]) -> None:
    if isinstance(value, DAGNode):
        found.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _find_nodes(item, found)
    elif isinstance(value, _CONTAINERS):
        for item in value:
            _find_nodes(item, found)


def _replace(value: Any, results: dict[int, Any]) -> Any:
    """``value`` with each node in it replaced by its result; containers holding no node
    are returned as they are (the same object)."""
    if isinstance(value, DAGNode):
        return results[id(value)]
    if not isinstance(value, _CONTAINERS):
        return value
    found: list[DAGNode] = []
    _find_nodes(value, found)
    if not found:
        return value
    if isinstance(value, dict):
        return type(value)({key: _replace(item, results) for key, item in value.items()})
    items = [_replace(item, results) for item in value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*items)
    return type(value)(items)


def _check(check: ArgumentCheck, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A bind with arguments that do not fit the callee fails at ``bind``, not later."""
    if kwargs or not check.low <= len(args) <= check.high:
        check.bind(args, kwargs)


# -- what .bind() is on the API's callables -----------------------------------------------
def bind_function(function: Any, target: Any, options: dict[str, Any],
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> FunctionNode:
    """``target.bind(...)``: ``target`` is the remote function ``function`` or what its
    ``.options(...)`` returned (``options``, for ``get_options()``)."""
    return FunctionNode(function, args, kwargs, options, target)


def bind_actor(actor_class: Any, target: Any, options: dict[str, Any],
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> ClassNode:
    """``target.bind(...)``: ``target`` is the actor class or its ``.options(...)``."""
    return ClassNode(actor_class, args, kwargs, options, target)


def bind_method(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ClassMethodNode:
    """``handle.method.bind(...)``: a call on a live actor (options are the method's)."""
    checks = method._checks
    check = checks.get(method._name) if checks is not None else None
    if check is not None:
        _check(check, args, kwargs)
    return ClassMethodNode(method, method._name, args, kwargs, {})
