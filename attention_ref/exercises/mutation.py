"""The checker's own mutation test: wrong backwards nobody wrote by hand must all fail.

Each exercise's reference backward (the library's formulas) and each spot-the-bug fix is
mutated mechanically, one change at a time, on its syntax tree: an operator swapped, a term
dropped, a constant or an axis changed, a transpose dropped, a product's factors swapped,
``keepdims`` or ``axis=`` dropped, a reduction over fewer axes, two outputs swapped, an output
cast to float64 or squeezed, the scale computed from a shape, the sum over broadcast axes
dropped or done on the first axis only, the weights renormalised by their sum (0/0 on a row
with no allowed key). A random sweep of inputs drawn
from the exercise's contract (:meth:`Contract.sample_case`, never the checker's own cases)
decides which mutants are wrong; the checker's default run must fail every one of them.

``python -m attention_ref.exercises.mutation`` runs every mutant and prints the score;
``--write PATH`` saves the verdicts as JSON (``tests/exercises/mutants.json`` is committed and
``tests/exercises/test_mutants.py`` re-derives a sample of it).
"""
from __future__ import annotations

import argparse
import ast
import copy
import inspect
import json
import sys
import textwrap
import types
import warnings
from dataclasses import dataclass

import numpy as np

from .._atomic import write_atomic
from .._checks import signals_land_here
from .bugs import BUGS
from .catalogue import EXERCISES
from .checker import _check_here, _right
from .process import _OutOfTime, _time_limit

__all__ = ["Mutant", "mutants", "verdict", "SWEEP"]

SWEEP = 40  # random draws from the contract that decide whether a mutant is wrong
_F64 = ast.Attribute(ast.Name("np", ast.Load()), "float64", ast.Load())


@dataclass(frozen=True)
class Mutant:
    """One mutant: where it comes from, what was changed, and the function it makes."""

    exercise: str
    origin: str  # "reference: module.function" or "bug: name"
    index: int  # its number among the origin's mutants
    change: str  # what was mutated, in words, with the line
    function: object  # callable with the exercise's signature


# -- the mutation operators ------------------------------------------------------------------------

def _sites(tree):
    """Every (node, replacements) pair: each replacement is (words, a function node -> new node)."""
    for node in ast.walk(tree):
        found = []
        if isinstance(node, ast.BinOp):
            swaps = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
            if type(node.op) in swaps:
                found.append((f"{type(node.op).__name__} -> {swaps[type(node.op)].__name__}",
                              lambda n, op=swaps[type(node.op)]: ast.BinOp(n.left, op(), n.right)))
            if isinstance(node.op, ast.MatMult):
                found.append(("factors of @ swapped", lambda n: ast.BinOp(n.right, ast.MatMult(), n.left)))
            found.append(("right operand dropped", lambda n: n.left))
            found.append(("left operand dropped", lambda n: n.right))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            found.append(("minus sign dropped", lambda n: n.operand))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
            c = node.value
            for new in dict.fromkeys([c + 1, -c if c else 2, c - 1]):
                found.append((f"constant {c} -> {new}", lambda n, new=new: ast.Constant(new)))
        elif isinstance(node, ast.keyword) and node.arg == "keepdims":
            found.append(("keepdims=True dropped", lambda n: ast.keyword("keepdims", ast.Constant(False))))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name == "swapaxes":  # a.swapaxes(-1, -2) or np.swapaxes(a, -1, -2): the transpose dropped
                target = node.args[0] if isinstance(node.func.value, ast.Name) and node.func.value.id == "np" \
                    else node.func.value
                found.append(("transpose dropped", lambda n, t=target: t))
            if name == "reshape":  # x.reshape(-1, d).sum(axis=0) then sums over the first axis only
                found.append(("reshape dropped (a reduction over fewer axes)", lambda n: n.func.value))
            if name in ("sum", "mean") and any(k.arg == "axis" for k in node.keywords):
                found.append((f"{name} over every axis", lambda n: ast.Call(
                    n.func, n.args, [k for k in n.keywords if k.arg not in ("axis", "keepdims")])))
                for k in node.keywords:
                    if k.arg == "axis" and isinstance(k.value, ast.Tuple) and len(k.value.elts) > 1:
                        found.append((f"{name} over fewer axes", lambda n: _fewer_axes(n)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("unbroadcast",
                                                                                               "_sum_to"):
            found.append(("sum over the broadcast axes dropped", lambda n: n.args[0]))
            if len(node.args) == 2:  # issue 42: a size-1 axis summed back only when it is the first
                found.append(("sum over a broadcast axis of size 1 only when it is the first", lambda n: ast.Call(
                    ast.Name("_mutant_sum_first_axis_only", ast.Load()), n.args, [])))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if node.attr == "T":
                found.append(("transpose .T dropped", lambda n: n.value))
            if node.attr in ("weights", "y"):  # issue 42: renormalised: 0/0 on a row with no allowed key
                found.append((f"{node.attr} renormalised by its sum along the last axis", lambda n: ast.parse(
                    f"({ast.unparse(n)} / {ast.unparse(n)}.sum(axis=-1, keepdims=True))", mode="eval").body))
            if node.attr == "scale":
                found.append(("scale from the last axis of q", lambda n: ast.parse(
                    f"(1 / np.sqrt({ast.unparse(n.value)}.q.shape[-1]))", mode="eval").body))
        elif isinstance(node, ast.Name) and node.id == "scale" and isinstance(node.ctx, ast.Load):
            found.append(("scale from the last axis of q", lambda n: ast.parse(
                "(1 / np.sqrt(q.shape[-1]))", mode="eval").body))
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            elts = node.value.elts
            for i in range(len(elts) - 1):
                found.append((f"outputs {i} and {i + 1} swapped", lambda n, i=i: _swap(n, i)))
            for i in range(len(elts)):
                found.append((f"output {i} cast to float64", lambda n, i=i: _wrap(n, i, "astype")))
                found.append((f"output {i} squeezed", lambda n, i=i: _wrap(n, i, "squeeze")))
        elif isinstance(node, ast.Return) and node.value is not None and not isinstance(node.value, ast.Dict):
            found.append(("output cast to float64", lambda n: ast.Return(_cast(n.value))))
            found.append(("output squeezed", lambda n: ast.Return(_squeeze(n.value))))
        if found:
            yield node, found


def _fewer_axes(n):
    n = copy.deepcopy(n)
    for k in n.keywords:
        if k.arg == "axis" and isinstance(k.value, ast.Tuple):
            k.value.elts = k.value.elts[1:]
    return n


def _swap(n, i):
    n = copy.deepcopy(n)
    e = n.value.elts
    e[i], e[i + 1] = e[i + 1], e[i]
    return n


def _cast(value):
    return ast.Call(ast.Attribute(ast.Name("np", ast.Load()), "asarray", ast.Load()), [value],
                    [ast.keyword("dtype", _F64)])


def _squeeze(value):
    return ast.Call(ast.Attribute(ast.Name("np", ast.Load()), "squeeze", ast.Load()), [value], [])


def _wrap(n, i, how):
    n = copy.deepcopy(n)
    e = n.value.elts
    if isinstance(e[i], ast.Constant) and e[i].value is None:
        return n
    e[i] = _cast(e[i]) if how == "astype" else _squeeze(e[i])
    return n


class _Replace(ast.NodeTransformer):
    def __init__(self, target, make):
        self.target, self.make = target, make

    def generic_visit(self, node):
        if node is self.target:
            return ast.copy_location(self.make(node), node) if not isinstance(node, ast.keyword) else self.make(node)
        return super().generic_visit(node)


def _variants(source):
    """(words, mutated source) for every mutation of ``source``'s first function."""
    tree = ast.parse(textwrap.dedent(source))
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    if func.body and isinstance(func.body[0], ast.Expr) and isinstance(func.body[0].value, ast.Constant):
        func.body = func.body[1:]  # the docstring is no code
    func.returns = None
    for a in func.args.args:
        a.annotation = None
    out = []
    sites = list(_sites(func))
    for position, (node, found) in enumerate(sites):
        for words, make in found:
            mutated = copy.deepcopy(tree)
            target = [n for n, _ in _sites(next(x for x in mutated.body if isinstance(x, ast.FunctionDef)))][position]
            mutated = ast.fix_missing_locations(_Replace(target, make).visit(mutated))
            text = ast.unparse(mutated)
            line = getattr(node, "lineno", 0)
            out.append((f"line {line}: {words}", text))
    seen, unique = set(), []
    for words, text in out:
        if text not in seen:
            seen.add(text)
            unique.append((words, text))
    return unique


def _mutant_sum_first_axis_only(grad, shape):
    """A mistaken sum back to ``shape``: the missing leading axes, and a size-1 axis only when it
    is the first (the mutants' "only when it is the first")."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra))) if extra > 0 else grad
    if len(shape) and shape[0] == 1 != grad.shape[0]:
        grad = grad.sum(axis=0, keepdims=True)
    return grad


def _double_variants(source, rng, count):
    """(words, mutated source) for ``count`` random pairs of changes at two different places of
    ``source``'s first function (second-order mutants: two mistakes at once), drawn with ``rng``."""
    tree = ast.parse(textwrap.dedent(source))
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    if func.body and isinstance(func.body[0], ast.Expr) and isinstance(func.body[0].value, ast.Constant):
        func.body = func.body[1:]
    func.returns = None
    for a in func.args.args:
        a.annotation = None
    sites = list(_sites(func))
    changes = [(p, j) for p, (_, found) in enumerate(sites) for j in range(len(found))]
    out = []
    for _ in range(count if len(sites) > 1 else 0):
        (p1, j1), (p2, j2) = (changes[int(i)] for i in rng.choice(len(changes), 2, replace=False))
        if p1 == p2:
            continue
        mutated = copy.deepcopy(tree)
        fn = next(x for x in mutated.body if isinstance(x, ast.FunctionDef))
        nodes = [n for n, _ in _sites(fn)]
        makes = [f for _, f in _sites(fn)]
        first, second = (nodes[p1], makes[p1][j1]), (nodes[p2], makes[p2][j2])
        if any(second[0] is n for n in ast.walk(first[0])) or any(first[0] is n for n in ast.walk(second[0])):
            continue  # one inside the other: the outer change may drop the inner
        for node, (_, make) in (first, second):
            mutated = _Replace(node, make).visit(mutated)
        words = f"line {getattr(sites[p1][0], 'lineno', 0)}: {sites[p1][1][j1][0]}; line" \
                f" {getattr(sites[p2][0], 'lineno', 0)}: {sites[p2][1][j2][0]}"
        out.append((words, ast.unparse(ast.fix_missing_locations(mutated))))
    return out


def held_out(per_origin=30, seed=2026) -> list:
    """Second-order mutants (two changes at once) of every reference backward and bug fix:
    wrong attempts that the checker was never tuned on, for measuring how often it is right on
    attempts it never saw (docs/exercises.md). Returns their verdicts, as :func:`run` does."""
    rng = np.random.default_rng(seed)
    found = []
    for e in EXERCISES.values():
        module, target, public = _reference_targets(e)
        for i, (words, text) in enumerate(_double_variants(inspect.getsource(module.__dict__[target]), rng,
                                                           per_origin)):
            namespace = {**module.__dict__, "_mutant_sum_first_axis_only": _mutant_sum_first_axis_only}
            try:
                exec(compile(text, f"<held-out {target} {i}>", "exec"), namespace)
            except Exception:  # noqa: BLE001
                continue
            fn = namespace[target] if target == public.__name__ else types.FunctionType(
                public.__code__, namespace, public.__name__, public.__defaults__, public.__closure__)
            found.append(Mutant(e.name, f"reference: {module.__name__}.{target}", i, words, fn))
    for bug in BUGS.values():
        fixed = bug.source.replace(*bug.fix)
        for i, (words, text) in enumerate(_double_variants(fixed, rng, per_origin)):
            namespace = {"np": np, "_mutant_sum_first_axis_only": _mutant_sum_first_axis_only}
            try:
                exec(compile(fixed, "<fixed>", "exec"), namespace)
                exec(compile(text, f"<held-out {bug.name} {i}>", "exec"), namespace)
            except Exception:  # noqa: BLE001
                continue
            found.append(Mutant(bug.exercise, f"bug: {bug.name}", i, words, namespace[bug.exercise]))
    draws = {name: _sweep(e, seed=54321) for name, e in EXERCISES.items()}
    return [verdict(m, draws[m.exercise]) for m in found]


# -- where the mutants come from -------------------------------------------------------------------

def _reference_targets(e):
    """The library function that holds the exercise's formulas, and how to call it as the
    exercise's backward: (module, function name, the public backward)."""
    public = e.backward
    module = sys.modules[public.__module__]
    names = [n for n in public.__code__.co_names if inspect.isfunction(module.__dict__.get(n))
             and (n.startswith("_") and n.endswith(("backward", "_merge", "_split")) or n.endswith("_backward_formula"))]
    return module, (names[0] if names else public.__name__), public


def _reference_mutants(e):
    module, target, public = _reference_targets(e)
    source = inspect.getsource(module.__dict__[target])
    for i, (words, text) in enumerate(_variants(source)):
        namespace = {**module.__dict__, "_mutant_sum_first_axis_only": _mutant_sum_first_axis_only}
        try:
            exec(compile(text, f"<mutant {target} {i}>", "exec"), namespace)
        except Exception:  # noqa: BLE001  (a mutant that does not compile is no mutant)
            continue
        if target == public.__name__:
            fn = namespace[target]
        else:
            fn = types.FunctionType(public.__code__, namespace, public.__name__, public.__defaults__,
                                    public.__closure__)
        yield Mutant(e.name, f"reference: {module.__name__}.{target}", i, words, fn)


def _bug_mutants(bug):
    fixed = bug.source.replace(*bug.fix)
    for i, (words, text) in enumerate(_variants(fixed)):
        namespace = {"np": np, "_mutant_sum_first_axis_only": _mutant_sum_first_axis_only}
        try:
            exec(compile(fixed, "<fixed>", "exec"), namespace)  # its helpers (_sum_to)
            exec(compile(text, f"<mutant {bug.name} {i}>", "exec"), namespace)
        except Exception:  # noqa: BLE001
            continue
        yield Mutant(bug.exercise, f"bug: {bug.name}", i, words, namespace[bug.exercise])


def mutants():
    """Every mutant of every reference backward and every bug's fix."""
    for e in EXERCISES.values():
        yield from _reference_mutants(e)
    for bug in BUGS.values():
        yield from _bug_mutants(bug)


# -- the verdicts ----------------------------------------------------------------------------------

def _sweep(e, seed=12345, n=SWEEP):
    """Random draws from the contract, with the reference's outputs on them."""
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n):
        case = e.contract.sample_case(rng)
        out, cache = e.forward(*case.inputs, **case.kwargs)
        dout = rng.standard_normal(np.shape(out)).astype(np.result_type(out))
        draws.append((dout, cache, _flat(e.run(e.backward, dout, copy.deepcopy(cache)))))
    return draws


def _flat(result):
    values = result if isinstance(result, tuple) else (result,)
    flat = []
    for v in values:
        flat.extend(v.items() if isinstance(v, dict) else [("", v)])
    return flat


def _wrong_on(e, fn, draws) -> bool:
    """Whether ``fn`` differs from the reference (values, shape or dtype) or fails on a draw."""
    for dout, cache, truth in draws:
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings(), _time_limit(2.0):
                warnings.simplefilter("ignore")
                got = _flat(e.run(fn, dout.copy(), copy.deepcopy(cache)))
                signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
        except (Exception, _OutOfTime):  # noqa: BLE001  (a mutant may raise anything)
            return True
        if len(got) != len(truth):
            return True
        for (kg, g), (kt, t) in zip(got, truth):
            if kg != kt or (t is None) != (g is None) or (t is not None and not _right(g, t)):
                return True
    return False


def verdict(m: Mutant, draws) -> dict:
    """``wrong`` (the sweep tells it from the reference) and ``caught`` (the checker fails it)."""
    e = EXERCISES[m.exercise]
    wrong = _wrong_on(e, m.function, draws)
    caught = None
    if wrong:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the library's own code, mutated: no process of its own needed (the student's gets one)
            caught = not _check_here(e, m.function, None, 0, set(), 2.0).ok
            signals_land_here()  # a Ctrl-C is raised inside the block (_pair_checks.py)
    return {"origin": m.origin, "index": m.index, "change": m.change, "wrong": wrong, "caught": caught}


def run(keep=lambda m: True) -> list:
    draws = {name: _sweep(e) for name, e in EXERCISES.items()}
    return [verdict(m, draws[m.exercise]) for m in mutants() if keep(m)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attention_ref.exercises.mutation",
                                     description="Mutate the reference backwards and the bugs' fixes; every"
                                                 " wrong mutant must fail the checker.")
    parser.add_argument("--write", metavar="PATH", help="save the verdicts as JSON (a new file, renamed into place)")
    parser.add_argument("--held-out", type=int, metavar="N", help="instead: N random second-order mutants per"
                        " origin (two changes at once, never used to tune the checker), and the score on them")
    args = parser.parse_args(argv)
    results = held_out(args.held_out) if args.held_out else run()
    wrong = [r for r in results if r["wrong"]]
    missed = [r for r in wrong if not r["caught"]]
    kind = "second-order mutants" if args.held_out else "mutants"
    equivalent = "" if args.held_out else f" ({len(results) - len(wrong)} equivalent on {SWEEP} draws per exercise)"
    print(f"{len(results)} {kind}, {len(wrong)} wrong on the sweep, {len(wrong) - len(missed)} of them fail"
          f" the checker{equivalent}")
    for r in missed:
        print(f"  not caught: {r['origin']} #{r['index']}: {r['change']}")
    if args.held_out:
        return 0  # a score on mutants never used to tune the checker, not a gate
    if args.write:
        write_atomic(args.write, json.dumps(results, indent=0) + "\n")
    return 0 if not missed else 1


if __name__ == "__main__":
    raise SystemExit(main())
