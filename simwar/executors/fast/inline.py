"""A rule of :mod:`simwar.core.rules` written out in generated code, derived from its definition.

The scalar block functions (:mod:`simwar.executors.fast.codegen`) apply ``begins``,
``released`` and ``returns`` a few times per op of every segment; a Python call costs two to
three times the rule's own comparison. So where the rule is a few plain lines, the generated
code carries those lines rather than a call: :func:`inline` reads the rule's source (the one
definition, in ``simwar/core/rules.py``), puts the call's arguments in place of its
parameters, gives its locals names of their own and folds what the arguments make constant
(a ``same_stream`` known at generation, a ``fired`` that is ``None``). The text is the
rule's, operation for operation, so every value is the call's, bit for bit (the exactness
tests hold the executors to the SimPy engine's answers).

A rule is inlined only if it is a function of positional parameters whose body is
assignments to plain names and a ``return`` (the last two statements may be
``if TEST: return A`` and ``return B``: the expression ``A if TEST else B``), reading
nothing but its parameters and locals; any other raises :class:`NotInlinable`.

Imports: the standard library only.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import textwrap
from typing import Callable, Sequence

__all__ = ["NotInlinable", "inline"]


class NotInlinable(ValueError):
    """The rule's definition is not of the form the module docstring names."""


@functools.lru_cache(maxsize=None)
def _definition(fn: Callable) -> tuple[tuple[str, ...], tuple[ast.Assign, ...], ast.expr]:
    """The rule's parameters, its assignments and its returned expression."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError) as exc:
        raise NotInlinable(f"{name}: no Python source ({exc})") from None
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise NotInlinable(f"{name}: not a function definition")
    a = fdef.args
    if a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults:
        raise NotInlinable(f"{name}: takes more than plain positional parameters")
    params = tuple(p.arg for p in a.args)
    body = list(fdef.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    # ``if TEST: return A`` then ``return B``: ``return A if TEST else B``
    if (len(body) >= 2 and isinstance(body[-2], ast.If) and not body[-2].orelse
            and len(body[-2].body) == 1 and isinstance(body[-2].body[0], ast.Return)
            and isinstance(body[-1], ast.Return) and body[-2].body[0].value is not None
            and body[-1].value is not None):
        test, then, other = body[-2].test, body[-2].body[0].value, body[-1].value
        body[-2:] = [ast.Return(ast.IfExp(test, then, other))]
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        raise NotInlinable(f"{name}: does not end in a return of a value")
    known = set(params)
    for stmt in body[:-1]:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            raise NotInlinable(f"{name}: a statement other than an assignment to a name")
        _check_reads(name, stmt.value, known)
        known.add(stmt.targets[0].id)
    _check_reads(name, body[-1].value, known)
    return params, tuple(body[:-1]), body[-1].value


def _check_reads(name: str, expr: ast.expr, known: set[str]) -> None:
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id not in known:
            raise NotInlinable(f"{name}: reads '{node.id}', neither a parameter nor a local")
        if isinstance(node, (ast.Call, ast.NamedExpr, ast.Lambda, ast.Await, ast.Yield,
                             ast.YieldFrom, ast.comprehension)):
            raise NotInlinable(f"{name}: more than arithmetic and comparisons")


class _Substitute(ast.NodeTransformer):
    """Parameters replaced by the arguments' expressions, locals renamed, constants folded."""

    def __init__(self, args: dict[str, ast.expr], renamed: dict[str, str]):
        self.args, self.renamed = args, renamed

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in self.args:
            return copy.deepcopy(self.args[node.id])
        if node.id in self.renamed:
            return ast.copy_location(ast.Name(self.renamed[node.id], node.ctx), node)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        # ``None is not None``: what a ``fired`` of None makes of the rule's test
        if (len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.IsNot))
                and isinstance(node.left, ast.Constant)
                and isinstance(node.comparators[0], ast.Constant)):
            same = node.left.value is node.comparators[0].value
            return ast.Constant(same if isinstance(node.ops[0], ast.Is) else not same)
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not) and isinstance(node.operand, ast.Constant):
            return ast.Constant(not node.operand.value)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        self.generic_visit(node)
        values = list(node.values)
        # ``c and X`` is c where c is false, else X (``or`` the other way): exactly
        while len(values) > 1 and isinstance(values[0], ast.Constant):
            decided = not values[0].value if isinstance(node.op, ast.And) else values[0].value
            if decided:
                return values[0]
            values.pop(0)
        return values[0] if len(values) == 1 else ast.BoolOp(node.op, values)

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.test, ast.Constant):
            return node.body if node.test.value else node.orelse
        return node


def inline(fn: Callable, args: Sequence[str], prefix: str) -> tuple[list[str], str]:
    """The rule ``fn`` applied to ``args`` (expressions' source) as generated code: the lines
    to run first, then the expression of its value. Its locals are named ``prefix`` + their
    name (so none meets a name of the code around it); an argument that is not a name or a
    constant and that the rule reads more than once is evaluated once, into such a local."""
    lines, expr = _inline(fn, tuple(args), prefix)
    return list(lines), expr


@functools.lru_cache(maxsize=4096)  # a block's ops apply the rules to few distinct names
def _inline(fn: Callable, args: tuple[str, ...], prefix: str) -> tuple[tuple[str, ...], str]:
    params, assigns, value = _definition(fn)
    if len(args) != len(params):
        raise TypeError(f"{fn.__name__} takes {len(params)} arguments, given {len(args)}")
    exprs = {p: ast.parse(text, mode="eval").body for p, text in zip(params, args)}
    # first the constants in place and folded (a branch they rule out reads nothing), the
    # locals renamed; then the other arguments, each read once in place, else held once
    first = _Substitute({p: e for p, e in exprs.items() if isinstance(e, ast.Constant)},
                        {a.targets[0].id: prefix + a.targets[0].id for a in assigns})
    trees = [(prefix + a.targets[0].id, first.visit(copy.deepcopy(a.value))) for a in assigns]
    trees.append((None, first.visit(copy.deepcopy(value))))
    reads: dict[str, int] = {}
    for _, tree in trees:
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and n.id in exprs:
                reads[n.id] = reads.get(n.id, 0) + 1
    lines: list[str] = []
    bound: dict[str, ast.expr] = {}
    for p, text in zip(params, args):
        expr = exprs[p]
        if isinstance(expr, ast.Constant):
            continue
        if isinstance(expr, ast.Name) or reads.get(p, 0) <= 1:
            bound[p] = expr
        else:
            lines.append(f"{prefix}{p} = {text}")
            bound[p] = ast.Name(prefix + p, ast.Load())
    then = _Substitute(bound, {})
    for target, tree in trees[:-1]:
        lines.append(f"{target} = {ast.unparse(then.visit(tree))}")
    return tuple(lines), ast.unparse(then.visit(trees[-1][1]))
