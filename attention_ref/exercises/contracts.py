"""Each exercise's input contract as data, and the cases drawn from it.

A :class:`Contract` lists the features of the library function's inputs (the dtype, the
batch axes, the mask, the head count, ...) with their values; the first value of each is
the *base*. The checker's default run is the base case and then, for every other value of
every feature, the base case with that one feature changed, so a case that goes wrong
points at one feature. :meth:`Contract.sample` draws random combinations of all the features
at once; the mutation test (``tests/exercises/test_mutants.py``) decides with them which
mutants are wrong, on inputs the checker's cases never show.

Every builder receives ``rng`` and one value per feature and returns a ``Case``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.heads import split_heads
from ..core.masks import causal_mask
from ..nn.encoder_block import init_encoder_block_params

__all__ = ["Case", "Contract", "CONTRACTS"]


@dataclass(frozen=True)
class Case:
    """One set of inputs an attempt is checked on."""

    inputs: tuple
    kwargs: dict = field(default_factory=dict)
    factors: dict = field(default_factory=dict)  # name -> value, for naming a constant ratio
    masked: np.ndarray | None = None  # entries of the first gradient that a mask blocks
    feature: str = ""  # what is special about this case, said when only it goes wrong
    sizes: dict = field(default_factory=dict)  # h, d_head, ...: compared between wrong and right cases
    features: dict = field(default_factory=dict)  # the contract's feature -> value of this case

    def describe(self) -> str:
        shapes = ", ".join(_positional(a) if isinstance(a, np.ndarray) else
                           ("params" if isinstance(a, dict) else repr(a)) for a in self.inputs)
        extra = "".join(f", {k}={_kwarg(v)}" for k, v in self.kwargs.items())
        return f"inputs {shapes}{extra}" + (f" ({self.feature})" if self.feature else "")


def _positional(a) -> str:
    """An input array as its shape, with "bool" or "with -inf" when it is a mask or holds one."""
    if a.dtype == bool:
        return f"bool {np.shape(a)}"
    return f"{np.shape(a)} with -inf" if a.dtype.kind == "f" and np.isneginf(a).any() else str(np.shape(a))


def _kwarg(v) -> str:
    if isinstance(v, np.ndarray):
        return f"{'bool' if v.dtype == bool else 'float'} mask {np.shape(v)}"
    return repr(v)


@dataclass(frozen=True)
class Contract:
    """The features of an exercise's inputs, each with its values (the first is the base),
    and the builder that turns one value per feature into a case."""

    features: dict  # feature -> tuple of values, base first
    build: Callable  # build(rng, **values) -> Case
    together: tuple = ()  # feature values that matter together: cases that change two or more features
    apart: tuple = ()  # feature values never drawn together by sample() (float32 scores near 800:
    #                    float32 keeps 800 to about 5e-5, too coarse for a gradient to be judged)

    def base(self) -> dict:
        return {name: values[0] for name, values in self.features.items()}

    def plan(self) -> list:
        """The default run's feature values: the base, then one feature changed per case, then
        a covering set in which every pair of values of two features shows together (fixed: the
        same for every student; see :func:`pairwise`)."""
        runs = [(self.base(), "")]
        for name, values in self.features.items():
            for value in values[1:]:
                runs.append(({**self.base(), name: value}, f"{name} = {value}"))
        for changes in self.together:
            runs.append(({**self.base(), **changes}, ", ".join(f"{k} = {v}" for k, v in changes.items())))
        seen = [values for values, _ in runs]
        for values in pairwise(self.features, self.apart, seen):
            changed = ", ".join(f"{k} = {v}" for k, v in values.items() if v != self.base()[k])
            runs.append((values, f"{PAIRS}: {changed}"))
        return runs

    def cases(self, rng) -> list:
        return [self._case(rng, values, varied) for values, varied in self.plan()]

    def sample(self, rng) -> dict:
        """One random combination of every feature's values (none of those kept ``apart``)."""
        while True:
            values = {name: values[int(rng.integers(len(values)))] for name, values in self.features.items()}
            if not any(all(values[k] == v for k, v in pair.items()) for pair in self.apart):
                return values

    def sample_case(self, rng):
        values = self.sample(rng)
        return self._case(rng, values, "")

    def _case(self, rng, values, varied):
        case = self.build(rng, **values)
        return type(case)(case.inputs, case.kwargs, case.factors, case.masked, varied or case.feature,
                          case.sizes, values)


#: how the cases of the covering set start their description
PAIRS = "pairs"


def pairwise(features, apart=(), seen=()) -> list:
    """A fixed set of feature combinations (dicts) in which every two values of two different
    features appear together at least once, counting the combinations ``seen`` already; none
    holds a combination kept ``apart``. Greedy, deterministic: each new combination starts
    from the first pair not yet covered and takes, feature by feature, the value that covers
    the most pairs still missing (the first such value on a tie)."""
    names = list(features)

    def forbidden(values):
        return any(all(k in values and values[k] == v for k, v in pair.items()) for pair in apart)

    def pairs_of(values):
        return {(a, values[a], b, values[b]) for i, a in enumerate(names) for b in names[i + 1:]
                if a in values and b in values}

    missing = set()
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for va in features[a]:
                for vb in features[b]:
                    if not forbidden({a: va, b: vb}):
                        missing.add((a, va, b, vb))
    for values in seen:
        missing -= pairs_of(values)
    order = {(a, va, b, vb): (names.index(a), features[a].index(va), names.index(b), features[b].index(vb))
             for a, va, b, vb in missing}
    chosen = []
    while missing:
        a, va, b, vb = min(missing, key=order.__getitem__)
        values = {a: va, b: vb}
        for name in names:
            if name in values:
                continue
            best, gain = None, -1
            for value in features[name]:
                trial = {**values, name: value}
                if forbidden(trial):
                    continue
                new = len(pairs_of(trial) & missing)
                if new > gain:
                    best, gain = value, new
            values[name] = best
        values = {name: values[name] for name in names}
        missing -= pairs_of(values)
        chosen.append(values)
    return chosen


def _case(*args, **kwargs):
    return Case(*args, **kwargs)


def _dtype(name):
    return np.float32 if name == "float32" else np.float64


def _normal(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _keep_mask(rng, n_q, n_k):
    """A random boolean mask (True = may attend) in which every query keeps a key."""
    mask = rng.random((n_q, n_k)) < 0.6
    mask[np.arange(n_q), rng.integers(0, n_k, size=n_q)] = True
    return mask


def _float_mask(rng, n_q, n_k, dtype=np.float64):
    """An additive mask: -inf on some keys (every query keeps one), a bias on the others."""
    keep = _keep_mask(rng, n_q, n_k)
    return np.where(keep, rng.standard_normal((n_q, n_k)), -np.inf).astype(dtype)


def _mask(rng, kind, n_q, n_k, dtype, shape="(n_q, n_k)", batch=()):
    """A mask of a kind ("none", "bool", "float -inf", "causal", "bool, an empty row": a query
    that may attend no key, whose weights, output and gradients are zero) and of a shape the
    forwards accept: (n_q, n_k), (n_k,) and (1, n_k) (one row for every query: its first), or
    one mask per batch item (``batch`` + (n_q, n_k))."""
    if kind == "none":
        return None
    items = int(np.prod(batch)) if shape == "per batch item" and batch else 1
    masks = []
    for _ in range(items):
        if kind.startswith("bool"):
            m = _keep_mask(rng, n_q, n_k)
        elif kind == "float -inf":
            m = _float_mask(rng, n_q, n_k, dtype)
        else:
            m = causal_mask(n_q, n_k)  # "causal": the queries are the last n_q keys' positions
        if kind.endswith("an empty row"):
            m[-1] = False if m.dtype == bool else -np.inf  # the last query sees no key
        masks.append(m)
    m = masks[0]
    if shape == "(n_k,)":
        return m[-1] if kind.endswith("an empty row") else m[0]
    if shape == "(1, n_k)":
        return (m[-1] if kind.endswith("an empty row") else m[0])[None, :]
    if shape == "per batch item" and batch:
        return np.stack(masks).reshape(tuple(batch) + (n_q, n_k))
    return m


def scale_factors(d_k, scale=None):
    """Named constants a wrong attempt's ratio may equal."""
    found = {"sqrt(d_k)": math.sqrt(d_k), "1/sqrt(d_k)": 1 / math.sqrt(d_k), "d_k": d_k, "1/d_k": 1 / d_k}
    scale = 1 / math.sqrt(d_k) if scale is None else scale  # the default scale is 1/sqrt(d_k)
    found.update({"scale": scale, "1/scale": 1 / scale})
    return found


def _batch(kind, b):
    """Leading axes for a batch kind: none, one, two, of size one."""
    return {"none": (), "one": (b,), "two": (2, b), "size 1": (1,)}[kind]


# -- softmax --------------------------------------------------------------------------------------

def _softmax(rng, dtype, ndim, axis, size_1, mask):
    shape = [3, 4, 5, 2][:ndim] if ndim > 1 else [5]
    position = {"last": ndim - 1, "first": 0, "middle": ndim // 2}[axis]
    if size_1 == "softmax axis":
        shape[position] = 1
    elif size_1 == "another axis" and ndim > 1:
        shape[(position + 1) % ndim] = 1
    x = _normal(rng, tuple(shape), np.float64, 2.0)
    masked = None
    if mask != "none":
        keep = rng.random(x.shape) < 0.6
        first = np.moveaxis(np.zeros(x.shape, bool), position, -1)
        first[..., 0] = True  # every softmax row keeps one entry
        if mask == "an empty row":  # but one: all -inf, so y, dx are zero there, never NaN
            first.reshape(-1, first.shape[-1])[-1] = False
            keep_rows = np.moveaxis(keep, position, -1).copy()
            keep_rows.reshape(-1, keep_rows.shape[-1])[-1] = False
            keep = np.moveaxis(keep_rows, -1, position)
        masked = ~(keep | np.moveaxis(first, -1, position))
        x[masked] = -np.inf
    kwargs = {} if axis == "last" else {"axis": position - ndim if axis == "middle" else position}
    return _case((x.astype(_dtype(dtype)),), kwargs, masked=masked)


SOFTMAX = Contract({"dtype": ("float64", "float32"), "ndim": (3, 1, 2, 4), "axis": ("last", "first", "middle"),
                    "size_1": ("none", "softmax axis", "another axis"),
                    "mask": ("none", "-inf entries", "an empty row")},
                   _softmax)


# -- linear ---------------------------------------------------------------------------------------

def _linear(rng, dtype, leading, bias, widths, size_1):
    dt = _dtype(dtype)
    n, d_in = (1 if size_1 == "rows" else 4), (1 if size_1 == "d_in" else 3)
    d_out = 1 if size_1 == "d_out" else d_in if widths == "d_out = d_in" else d_in + 2
    lead = {0: (), 1: (n,), 2: (2, n), 3: (2, 1 if size_1 == "a batch axis" else 3, n)}[leading]
    x, W = _normal(rng, lead + (d_in,), dt), _normal(rng, (d_in, d_out), dt)
    b = _normal(rng, (d_out,), dt) if bias == "yes" else None
    rows = int(np.prod(lead)) if lead else 1
    return _case((x, W, b), factors={"1/rows": 1 / rows})


LINEAR = Contract({"dtype": ("float64", "float32"), "leading": (1, 0, 2, 3), "bias": ("yes", "no"),
                   "widths": ("d_out != d_in", "d_out = d_in"),
                   "size_1": ("none", "rows", "d_in", "d_out", "a batch axis")}, _linear)


# -- attention ------------------------------------------------------------------------------------

def _large_scores(rng, q_batch, k_batch, n_q, n_k, d_k, d_v, scale):
    """q, k, v whose scores sit near 800 (exp overflows float64 beyond 709) but differ by a few
    units within a row, so the probabilities stay spread: subtracting the row maximum matters."""
    u = rng.standard_normal(d_k)
    u /= np.linalg.norm(u)
    c = math.sqrt(800.0 / scale)  # q . k * scale = c^2 * scale + small = 800 + small
    q = c * u + rng.standard_normal(q_batch + (n_q, d_k))
    k = c * u + 0.05 * rng.standard_normal(k_batch + (n_k, d_k))
    return q, k, rng.standard_normal(k_batch + (n_k, d_v))


#: batch axes of q and of k, v: (q's, k's and v's); each kind of broadcast, on each axis
_BROADCASTS = ("k, v broadcast", "q broadcast", "k, v broadcast on axis 2", "q broadcast on axis 2")


def _broadcast(batch, b):
    """q's batch axes and k's (and v's) for a batch kind: the same, or one of them broadcast
    against the other (none, or size 1 on the first or on the second of two axes)."""
    kinds = {"k, v broadcast": ((b,), (1,)), "q broadcast": ((), (b,)),
             "k, v broadcast on axis 2": ((2, b), (2, 1)), "q broadcast on axis 2": ((2, 1), (2, b)),
             "k, v no batch": ((b,), ())}
    return kinds[batch] if batch in kinds else (_batch(batch, b),) * 2


def _attention(rng, dtype, scale, batch, size_1, mask, mask_shape, lengths, widths, scores):
    dt = _dtype(dtype)
    b = 1 if size_1 == "batch" else 3  # three items: "right only at batch item [0]" can show
    n_q = 1 if size_1 == "n_q" else 3  # one query still sees 3 or 5 keys: its gradient is not 0
    n_k = 1 if size_1 == "n_k" else 3 if lengths == "n_q = n_k" else 5
    d_k = 1 if size_1 == "d_k" else 3
    d_v = 1 if size_1 == "d_v" else d_k if widths == "d_v = d_k" else d_k + 1
    qb, kb = _broadcast(batch, b)
    s = 0.3 if scale == "given" else 1 / math.sqrt(d_k)
    if scores == "near 800":
        q, k, v = _large_scores(rng, qb, kb, n_q, n_k, d_k, d_v, s)
    else:
        q, k, v = (rng.standard_normal(shape) for shape in (qb + (n_q, d_k), kb + (n_k, d_k), kb + (n_k, d_v)))
    q, k, v = (a.astype(dt) for a in (q, k, v))
    m = _mask(rng, mask, n_q, n_k, dt, mask_shape, np.broadcast_shapes(qb, kb))
    kwargs = {"scale": s} if scale == "given" else {}
    inputs = (q, k, v) if m is None else (q, k, v, m)
    return _case(inputs, kwargs, scale_factors(d_k, s if scale == "given" else None),
                 feature="scores near 800" if scores == "near 800" else "")


_MASK_SHAPES = ("(n_q, n_k)", "(n_k,)", "(1, n_k)", "per batch item")

ATTENTION = Contract({"dtype": ("float64", "float32"), "scale": ("default", "given"),
                      "batch": ("one", "none", "two") + _BROADCASTS,
                      "size_1": ("none", "n_q", "n_k", "d_k", "d_v", "batch"),
                      "mask": ("none", "bool", "float -inf", "causal", "bool, an empty row"),
                      "mask_shape": _MASK_SHAPES, "lengths": ("n_q = n_k", "n_q != n_k"),
                      "widths": ("d_v != d_k", "d_v = d_k"), "scores": ("ordinary", "near 800")}, _attention,
                     apart=({"dtype": "float32", "scores": "near 800"},))


# -- heads ----------------------------------------------------------------------------------------

def _split(rng, dtype, batch, h, d_head, size_1):
    n = 1 if size_1 == "N" else 4
    lead = _batch("size 1" if size_1 == "batch" else batch, 2)
    x = _normal(rng, lead + (n, h * d_head), _dtype(dtype))
    return _case((x, h), factors={"h": h, "1/h": 1 / h, "d_head": d_head}, sizes={"h": h, "d_head": d_head})


def _merge(rng, **values):
    case = _split(rng, **values)
    x, h = case.inputs
    return _case((split_heads(x, h), h), factors=case.factors, sizes=case.sizes)


_HEADS = {"dtype": ("float64", "float32"), "batch": ("one", "none", "two"), "h": (2, 1, 3),
          "d_head": (3, 1, 2), "size_1": ("none", "N", "batch")}
SPLIT, MERGE = Contract(_HEADS, _split), Contract(_HEADS, _merge)


# -- layer norm -----------------------------------------------------------------------------------

def _layer_norm(rng, dtype, leading, size_1, eps, spread):
    dt = _dtype(dtype)
    d = 1 if size_1 == "D" else 7  # D = 1: x_hat is 0, and a squeeze() of dgamma shows
    lead = {0: (), 1: (1 if size_1 == "rows" else 4,), 2: (3, 1 if size_1 == "rows" else 4)}[leading]
    x = _normal(rng, lead + (d,), dt, 3.0 if spread == "ordinary" else 0.05) + dt(1)  # small: var near eps
    return _case((x, _normal(rng, (d,), dt), _normal(rng, (d,), dt)), {} if eps == "default" else {"eps": eps})


LAYER_NORM = Contract({"dtype": ("float64", "float32"), "leading": (1, 0, 2), "size_1": ("none", "rows", "D"),
                       "eps": ("default", 0.1), "spread": ("ordinary", "small (var near eps)")}, _layer_norm)


# -- blockwise ------------------------------------------------------------------------------------

def _flash(rng, dtype, batch, mask, mask_shape, rule, block_size, widths, size_1, scores):
    dt = _dtype(dtype)
    n_q = 1 if size_1 == "n_q" else 4
    n_k = n_q + 2
    d_k = 1 if size_1 == "d_k" else 3
    d_v = 1 if size_1 == "d_v" else d_k if widths == "d_v = d_k" else d_k + 1
    lead, k_lead = _broadcast(batch, 2)  # k and v may be shared by the batch items
    if size_1 == "batch":
        lead, k_lead = (1,) * len(lead) or (1,), (1,) * len(k_lead)
    if scores == "near 800":
        q, k, v = _large_scores(rng, lead, k_lead, n_q, n_k, d_k, d_v, 1 / math.sqrt(d_k))
    else:
        q, k, v = (rng.standard_normal(b + (n, d)) for b, n, d in ((lead, n_q, d_k), (k_lead, n_k, d_k),
                                                                     (k_lead, n_k, d_v)))
    kwargs = {"mask": _mask(rng, mask, n_q, n_k, dt, mask_shape, np.broadcast_shapes(lead, k_lead))} \
        if mask != "none" else {}
    kwargs.update({"causal": True} if "causal" in rule else {})
    kwargs.update({"window": 0 if rule == "window 0" else 1} if "window" in rule else {})  # 0: the diagonal only
    kwargs["block_size"] = block_size
    return _case(tuple(a.astype(dt) for a in (q, k, v)), kwargs, scale_factors(d_k),
                 feature="scores near 800" if scores == "near 800" else "")


FLASH = Contract({"dtype": ("float64", "float32"),
                  "batch": ("one", "none", "two", "k, v broadcast", "k, v no batch", "k, v broadcast on axis 2"),
                  "mask": ("none", "bool", "float -inf", "bool, an empty row"), "mask_shape": _MASK_SHAPES,
                  "rule": ("none", "causal", "window", "causal and window", "window 0"),
                  "block_size": (2, 3, 1, 8), "widths": ("d_v != d_k", "d_v = d_k"),
                  "size_1": ("none", "n_q", "d_k", "d_v", "batch"), "scores": ("ordinary", "near 800")}, _flash,
                 together=({"mask": "bool", "rule": "causal and window"}, {"mask": "float -inf", "rule": "causal"}),
                 apart=({"dtype": "float32", "scores": "near 800"},))


# -- multi-head attention -------------------------------------------------------------------------

def _multi_head(rng, dtype, h, head_widths, model_width, input_widths, attention, bias, batch, lengths, mask,
                mask_shape, size_1, scale, scores):
    dt = _dtype(dtype)
    d_k, d_v = (3, 3) if head_widths == "d_v = d_k" else (3, 2)  # d_v changes too: a fixed width shows
    d = h * d_k if model_width == "d_model = h*d_k" else h * d_k + 1
    kdim, vdim = (d, d) if input_widths == "equal" or attention == "self" else (d + 1, d + 2)
    n_q = 1 if size_1 == "n_q" else 3
    n_k = n_q if attention == "self" else 3 if lengths == "n_q = n_k" else 4  # one query sees several keys
    lead, k_lead = _broadcast(batch, 2)
    if batch == "k, v broadcast":
        k_lead = ()  # key and value shared by every batch item of the query
    if attention == "self":
        lead = k_lead = max(lead, k_lead, key=len) if "on axis 2" not in batch else (2, 2)
    if size_1 == "batch":
        lead, k_lead = (1,) * len(lead) or (1,), (1,) * len(k_lead)
    present = _BIASES[bias]
    params = {}
    for name, (fan_in, fan_out) in {"q": (d, h * d_k), "k": (kdim, h * d_k), "v": (vdim, h * d_v),
                                    "o": (h * d_v, d)}.items():
        params["W_" + name] = rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in)
        params["b_" + name] = 0.1 * rng.standard_normal(fan_out) if name in present else None
    s = 0.4 if scale == "given" else 1 / math.sqrt(d_k)
    query = rng.standard_normal(lead + (n_q, d))
    key = query if attention == "self" else rng.standard_normal(k_lead + (n_k, kdim))
    value = key if attention == "self" else rng.standard_normal(k_lead + (n_k, vdim))
    if scores == "near 800":  # the query and key projections share a large direction in every head
        u = np.ones(h * d_k) / math.sqrt(h * d_k)  # unit, spread evenly: each head holds 1/h of |u|^2
        c = math.sqrt(800.0 * h / s)  # so each head's score is about c^2 / h * s = 800
        a = np.linalg.lstsq(params["W_q"].T, u, rcond=None)[0]  # a W_q = u
        query = c * a + 0.3 * rng.standard_normal(lead + (n_q, d))
        if attention == "self":
            key = value = query
        else:
            a_k = np.linalg.lstsq(params["W_k"].T, u, rcond=None)[0]  # a_k W_k = u
            key = c * a_k + 0.02 * rng.standard_normal(k_lead + (n_k, kdim))
    params = {k: None if v is None else v.astype(dt) for k, v in params.items()}
    m = _mask(rng, mask, n_q, n_k, dt, mask_shape, np.broadcast_shapes(lead, k_lead))
    kwargs = {"mask": m} if m is not None else {}
    kwargs.update({"scale": s} if scale == "given" else {})
    rows, k_rows = (int(np.prod(b)) if b else 1 for b in (lead, k_lead))  # means where a bias's sum belongs
    factors = {**scale_factors(d_k, s if scale == "given" else None), "h": h, "1/h": 1 / h,
               "1/rows (queries)": 1 / (rows * n_q), "1/rows (keys)": 1 / (k_rows * n_k)}
    inputs = tuple(x.astype(dt) if isinstance(x, np.ndarray) else x for x in (query, key, value))
    if attention == "self":
        inputs = (inputs[0], inputs[0], inputs[0])
    return _case((*inputs, params, h), kwargs, factors, feature="scores near 800" if scores == "near 800" else "",
                 sizes={"h": h, "d_head": d_k})


# which projections have a bias: all, none, or some present and the others None
_BIASES = {"all": "qkvo", "none": "", "q, v only": "qv", "k, o only": "ko"}

MULTI_HEAD = Contract({"dtype": ("float64", "float32"), "h": (2, 1, 3), "head_widths": ("d_v != d_k", "d_v = d_k"),
                       "model_width": ("d_model != h*d_k", "d_model = h*d_k"),
                       "input_widths": ("key, value wider", "equal"), "attention": ("cross", "self"),
                       "bias": tuple(_BIASES), "batch": ("one", "none", "two") + _BROADCASTS,
                       "lengths": ("n_q = n_k", "n_q != n_k"),
                       "mask": ("none", "bool", "float -inf", "causal", "bool, an empty row"),
                       "mask_shape": _MASK_SHAPES, "size_1": ("none", "n_q", "batch"),
                       "scale": ("default", "given"), "scores": ("ordinary", "near 800")}, _multi_head,
                      apart=({"dtype": "float32", "scores": "near 800"},
                             # self-attention near 800: the query is the key, so the large direction
                             # enters both sides, the softmax saturates and an independent right
                             # backward agrees with the library only to about 3e-8
                             {"attention": "self", "scores": "near 800"}))


# -- encoder block --------------------------------------------------------------------------------

def _encoder(rng, dtype, h, norm_first, activation, mask, batch, size_1, scale, eps):
    dt = _dtype(dtype)
    d_head, n = 2, (1 if size_1 == "N" else 4)
    d = h * d_head
    params = init_encoder_block_params(d, h, 2 * d, seed=int(rng.integers(1 << 30)))
    params = {k: (v + 0.1 * rng.standard_normal(v.shape)).astype(dt) for k, v in params.items()}
    m = None if mask == "none" else causal_mask(n) if mask == "causal" else \
        (np.arange(n) < max(1, n - 1))[None, :]  # (1, N): a padded tail, for any batch axes
    if mask == "an empty row":  # causal, and the last query sees no key: its attention output is 0
        m = causal_mask(n)
        m[-1] = False
    x = _normal(rng, _batch(batch, 2) + (n, d), dt)
    kwargs = {"mask": m, "norm_first": norm_first}
    if activation != "relu":
        kwargs["activation"] = activation
    if scale == "given":
        kwargs["scale"] = 0.45
    if eps != "default":
        kwargs["eps"] = eps
    factors = {"h": h, "1/h": 1 / h, **scale_factors(d_head, 0.45 if scale == "given" else None)}
    return _case((x, params, h), kwargs, factors, sizes={"h": h, "d_head": d_head})


ENCODER = Contract({"dtype": ("float64", "float32"), "h": (2, 1, 3), "norm_first": (False, True),
                    "activation": ("relu", "gelu", "gelu_exact"),
                    "mask": ("none", "padding", "causal", "an empty row"),
                    "batch": ("one", "none", "two"), "size_1": ("none", "N"), "scale": ("default", "given"),
                    "eps": ("default", 0.1)}, _encoder,
                   together=({"norm_first": True, "mask": "padding"}, {"norm_first": True, "mask": "causal"}))


CONTRACTS = {"softmax_backward": SOFTMAX, "linear_backward": LINEAR, "scaled_dot_product_attention_backward": ATTENTION,
             "split_heads_backward": SPLIT, "merge_heads_backward": MERGE, "layer_norm_backward": LAYER_NORM,
             "flash_attention_backward": FLASH, "multi_head_attention_backward": MULTI_HEAD,
             "encoder_block_backward": ENCODER}
