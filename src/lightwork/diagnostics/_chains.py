"""Whether a ``get`` in a loop feeds the loop's next call: a by-value dependent chain.

``x = get(f.remote(x))`` in a loop waits for each result before it submits the next
call, exactly like the get-in-loop mistake, but there each call needs the previous
result: "submit all first" cannot apply. The event log cannot tell the two apart when the
value travels by value (``TaskRecord.dep_tasks`` sees only refs), so the get-in-loop rule
asks the program's source, once per pair of lines, just before it would report:

1. the innermost loop (``for``, ``while``) holding both the ``get`` line and the line of
   the ``.remote()`` call whose result it got;
2. which values in that loop hold something computed from the get's result: the get
   call itself, then, round the loop to a fixed point, whatever an assignment (``=``,
   ``+=``, ``:=``, a ``for`` target) makes from one of them, and whatever a call is
   handed together with one (``results.append(value)``, ``update(state, value)``: the
   receiver and the other arguments may now hold it). Values are named by access path
   (``x``, ``self.w``; a subscript is its container), so ``self.w`` is not confused
   with ``self.items``;
3. the chain is dependent when the ``.remote()`` call's arguments read one of them.

It errs towards "dependent" (towards no finding): a call handed a result may keep it,
an object holding a tainted attribute is tainted as a whole. Only the source is read
(``linecache``; each file parsed once per content): nothing runs on the hot path.

:func:`feeds_next_call` answers True (dependent), False (the call's arguments read
nothing computed from the result: the classic mistake), or None when the source, the
loop or either call cannot be found (code without a file, a helper in another file):
the caller decides. A step function holding both calls (``def step(x): return
get(f.remote(x))``) is followed to the loops of its file that call it: dependent when one
of them feeds a call's result back into the next call (``x = step(x)``).
"""

from __future__ import annotations

import ast
import linecache
from collections.abc import Iterator

Site = tuple[str, int, str]

_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_trees: dict[str, tuple[str, ast.Module | None]] = {}  # file -> (its source, its tree)


def feeds_next_call(get_site: Site, submit_site: Site) -> bool | None:
    """Whether the values the ``get`` at ``get_site`` returned (or anything computed
    from them in the loop) are arguments of the ``.remote()`` call at ``submit_site``."""
    filename, get_line = get_site[0], get_site[1]
    if submit_site[0] != filename:
        return None
    tree = _tree(filename)
    if tree is None:
        return None
    submit_line = submit_site[1]
    loop = _innermost_loop(tree, get_line, submit_line)
    if loop is None:
        return _step_fed_back(tree, get_site, submit_line)
    sources = [node for node in _walk_scope(loop)
               if isinstance(node, ast.Call) and _covers(node, get_line)
               and _called_name(node) == "get"]
    submits = [node for node in _walk_scope(loop)
               if isinstance(node, ast.Call) and _covers(node, submit_line)
               and _called_name(node) == "remote"]
    if not sources or not submits:
        return None
    return _feeds(loop, sources, submits)


def _feeds(loop: ast.AST, sources: list[ast.Call], calls: list[ast.Call]) -> bool:
    """Whether in ``loop`` what ``sources`` return reaches the arguments of ``calls``."""
    source_ids = {id(node) for node in sources}
    tainted = _tainted_paths(loop, source_ids)
    return any(_reads(argument, tainted, source_ids)
               for call in calls for argument in _arguments(call))


def _step_fed_back(tree: ast.Module, get_site: Site, submit_line: int) -> bool | None:
    """A step function (``def step(x): return get(f.remote(x))``) called in a loop of
    the same file as ``x = step(x)``: whether some loop feeds a call's result back into
    the next call (None: the function is not called in a loop of this file)."""
    get_line, function = get_site[1], get_site[2]
    if not any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and node.name == function and _covers(node, get_line) and _covers(node, submit_line)
               for node in ast.walk(tree)):
        return None
    answer = None
    for loop in ast.walk(tree):
        if not isinstance(loop, _LOOPS):
            continue
        steps = [node for node in _walk_scope(loop)
                 if isinstance(node, ast.Call) and _called_name(node) == function]
        if steps:
            answer = _feeds(loop, steps, steps)
            if answer:
                return True
    return answer


# -- finding the code ------------------------------------------------------------------
def _tree(filename: str) -> ast.Module | None:
    source = "".join(linecache.getlines(filename))
    if not source:
        return None
    cached = _trees.get(filename)
    if cached is not None and cached[0] == source:
        return cached[1]
    try:
        tree: ast.Module | None = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        tree = None  # not Python we can read (a changed file, a compiled module)
    _trees[filename] = (source, tree)
    return tree


def _covers(node: ast.AST, line: int) -> bool:
    end = getattr(node, "end_lineno", None) or node.lineno  # type: ignore[attr-defined]
    return node.lineno <= line <= end  # type: ignore[attr-defined]


def _innermost_loop(tree: ast.Module, *lines: int) -> ast.AST | None:
    best = None
    for node in ast.walk(tree):
        # A loop inside another starts on a later line (or the same).
        if isinstance(node, _LOOPS) and all(_covers(node, line) for line in lines) and (
                best is None or node.lineno >= best.lineno):
            best = node
    return best


def _walk_scope(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node``, not entering nested functions or classes."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        yield child
        if not isinstance(child, _SCOPES):
            todo.extend(ast.iter_child_nodes(child))


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _arguments(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(keyword.value for keyword in call.keywords)]


# -- following the values ----------------------------------------------------------------
def _path(node: ast.AST) -> str | None:
    """The access path a target or a read names (``x``, ``self.w``), or None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _path(node.value)
        return None if base is None else f"{base}.{node.attr}"
    if isinstance(node, (ast.Subscript, ast.Starred)):
        return _path(node.value)  # an element stands for its container
    return None


def _target_paths(target: ast.AST) -> list[str]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [path for element in target.elts for path in _target_paths(element)]
    path = _path(target)
    return [] if path is None else [path]


def _related(path: str, tainted: set[str]) -> bool:
    return any(path == key or path.startswith(key + ".") or key.startswith(path + ".")
               for key in tainted)


def _reads(expr: ast.AST, tainted: set[str], source_ids: set[int]) -> bool:
    """Whether evaluating ``expr`` reads a tainted value or calls the get itself."""
    if id(expr) in source_ids:
        return True
    if isinstance(expr, (ast.Name, ast.Attribute)):
        path = _path(expr)
        if path is not None:
            return _related(path, tainted)  # its parts (self of self.x) are not reads of it
    if isinstance(expr, _SCOPES):
        return False
    return any(_reads(child, tainted, source_ids) for child in ast.iter_child_nodes(expr))


def _assignment(node: ast.AST) -> tuple[ast.AST, list[ast.AST]] | None:
    """(the value read, the targets it goes to) of a statement that binds names."""
    if isinstance(node, ast.Assign):
        return node.value, list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        return node.value, [node.target]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return node.iter, [node.target]
    return None


def _tainted_paths(loop: ast.AST, source_ids: set[int]) -> set[str]:
    """The access paths holding something computed from the get's result in ``loop``."""
    tainted: set[str] = set()
    nodes = list(_walk_scope(loop))
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        nodes.append(loop)  # its own target, when it iterates over a result
    changed = True
    while changed:  # round the loop: a value made late in the body feeds the next turn
        changed = False
        for node in nodes:
            made: list[str] = []
            flow = _assignment(node)
            if flow is not None and _reads(flow[0], tainted, source_ids):
                made = [path for target in flow[1] for path in _target_paths(target)]
            elif isinstance(node, ast.Call) and any(
                    _reads(argument, tainted, source_ids) for argument in _arguments(node)):
                # Whatever the call is handed together with the value may now hold it.
                receivers = [node.func.value] if isinstance(node.func, ast.Attribute) else []
                made = [path for expr in (*receivers, *_arguments(node))
                        for path in _target_paths(expr)]
            for path in made:
                if path not in tainted:
                    tainted.add(path)
                    changed = True
    return tainted
