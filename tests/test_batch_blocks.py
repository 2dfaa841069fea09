"""Blocks on parallel threads with BLAS on one thread (``attention_ref/_batch_blocks.py``).

The blocks only change which thread computes which (batch item, head) or which rows of a
product; the formulas are the plain path's. A matrix product may round differently with
another number of BLAS threads, so the two paths are compared with tolerances (1e-12 in
float64), and the gradient checks run through the blocks. ``fake_blas`` stands in for
threadpoolctl's controller, so these tests run the threads whether or not threadpoolctl is
installed; the last tests use the real one when it is there.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest

import attention_ref as ar
from attention_ref import _batch_blocks
from attention_ref.core import attention as attention_module

from tests._helpers import assert_close, check_gradients, random_params


class _FakeLibrary:
    """One BLAS library as threadpoolctl's controller shows it."""

    def __init__(self, threads):
        self.num_threads = threads
        self.calls = []

    def set_num_threads(self, n):
        self.calls.append(n)
        self.num_threads = n


class _FakeBlas:
    def __init__(self, threads):
        self.lib_controllers = [_FakeLibrary(threads), _FakeLibrary(threads)]

    @contextlib.contextmanager
    def limit(self, limits):
        """threadpoolctl's ``ThreadpoolController.limit``: set, and restore at the end."""
        before = [lib.num_threads for lib in self.lib_controllers]
        for lib in self.lib_controllers:
            lib.set_num_threads(limits)
        try:
            yield
        finally:
            for lib, n in zip(self.lib_controllers, before):
                lib.set_num_threads(n)


@pytest.fixture
def fake_blas(monkeypatch):
    """``fake_blas(n)``: BLAS reports ``n`` threads and every problem is large enough."""
    def use(threads, min_elements=0):
        blas = _FakeBlas(threads)
        monkeypatch.setattr(_batch_blocks, "_blas_controller", lambda: blas)
        monkeypatch.setattr(_batch_blocks, "MIN_ELEMENTS", min_elements)
        return blas
    return use


@pytest.fixture
def no_blocks(monkeypatch):
    monkeypatch.setattr(_batch_blocks, "_blas_controller", lambda: None)


def test_region_limits_blas_to_one_thread_and_restores_it(fake_blas):
    blas = fake_blas(3)
    assert _batch_blocks.workers() == 0
    with _batch_blocks.parallel_region(10, (8,)):
        assert _batch_blocks.workers() == 3
        assert [lib.num_threads for lib in blas.lib_controllers] == [1, 1]
        with _batch_blocks.parallel_region(10, (8,)):  # nested: changes nothing
            assert _batch_blocks.workers() == 3
        assert [lib.calls for lib in blas.lib_controllers] == [[1], [1]]
    assert _batch_blocks.workers() == 0
    assert [lib.calls for lib in blas.lib_controllers] == [[1, 3], [1, 3]]


def test_region_restores_blas_when_its_body_raises(fake_blas):
    blas = fake_blas(2)
    with pytest.raises(KeyError):
        with _batch_blocks.parallel_region(10, (8,)):
            raise KeyError("body")
    assert [lib.num_threads for lib in blas.lib_controllers] == [2, 2]
    assert _batch_blocks.workers() == 0 and _batch_blocks._owner is None


@pytest.mark.parametrize("threads, n, opens", [(1, 100, False), (4, 100, True), (4, 50, True), (4, 49, False)])
def test_region_opens_only_for_several_threads_and_enough_work(fake_blas, threads, n, opens):
    blas = fake_blas(threads, min_elements=50)
    with _batch_blocks.parallel_region(n, (8,)):
        assert _batch_blocks.workers() == (threads if opens else 0)
    assert all(lib.num_threads == threads for lib in blas.lib_controllers)


def test_without_threadpoolctl_nothing_changes(no_blocks, monkeypatch):
    monkeypatch.setattr(_batch_blocks, "MIN_ELEMENTS", 0)
    with _batch_blocks.parallel_region(1 << 40, (8,)):
        assert _batch_blocks.workers() == 0
        assert _batch_blocks.plan_blocks((8, 8)) is None


def test_missing_threadpoolctl_is_found_missing(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import fails
    monkeypatch.setattr(_batch_blocks, "_looked", False)
    monkeypatch.setattr(_batch_blocks, "_blas", None)
    assert _batch_blocks._blas_controller() is None


def test_one_region_at_a_time_a_second_thread_runs_in_one_piece(fake_blas):
    blas = fake_blas(2)
    inside, release = threading.Event(), threading.Event()
    seen = {}

    def other():
        with _batch_blocks.parallel_region(10, (8,)):
            seen["other workers"] = _batch_blocks.workers()
            inside.set()
            assert release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with _batch_blocks.parallel_region(10, (8,)):  # the other thread's region holds BLAS
        seen["main workers"] = _batch_blocks.workers()
    assert blas.lib_controllers[0].num_threads == 1  # the other region is still open
    release.set()
    t.join(10)
    assert seen == {"other workers": 2, "main workers": 0}
    assert [lib.num_threads for lib in blas.lib_controllers] == [2, 2]
    with _batch_blocks.parallel_region(10, (8,)):  # free again
        assert _batch_blocks.workers() == 2


def test_no_blocks_when_the_limit_does_not_take(fake_blas, monkeypatch):
    """threadpoolctl lets one thread control OpenBLAS: if another thread holds it, the limit
    is ignored and BLAS keeps its threads; then blocks would fight them, so none are cut."""
    blas = fake_blas(2)
    monkeypatch.setattr(_FakeLibrary, "set_num_threads", lambda self, n: None)
    with _batch_blocks.parallel_region(10, (8,)):
        assert _batch_blocks.workers() == 0
    assert [lib.num_threads for lib in blas.lib_controllers] == [2, 2]


@pytest.mark.parametrize("batch, threads, expected", [
    ((1, 8, 1), 2, (-2, [slice(0, 4), slice(4, 8)])),  # B = 1: the heads
    ((8, 8, 1), 2, (-3, [slice(0, 4), slice(4, 8)])),  # the first long enough axis
    ((3,), 4, (-1, [slice(0, 1), slice(1, 2), slice(2, 3)])),  # fewer items than threads
    ((2, 3), 4, (-1, [slice(0, 1), slice(1, 2), slice(2, 3)])),  # none long enough: the longest
    ((5,), 2, (-1, [slice(0, 2), slice(2, 5)])),
    ((1, 1), 2, None),
    ((), 2, None),
])
def test_plan_cuts_one_batch_axis_into_one_block_per_thread(fake_blas, batch, threads, expected):
    fake_blas(threads)
    assert _batch_blocks.plan_blocks(batch) is None  # outside a region
    with _batch_blocks.parallel_region(10, (8,)):
        assert _batch_blocks.plan_blocks(batch) == expected


def test_take_block_keeps_what_broadcasts():
    x = np.zeros((2, 4, 3, 5))
    assert _batch_blocks.take_block(x, -1, slice(1, 3)).shape == (2, 2, 3, 5)
    assert _batch_blocks.take_block(x, -2, slice(0, 1)).shape == (1, 4, 3, 5)
    assert _batch_blocks.take_block(x, -3, slice(0, 1)) is x  # no such axis
    broadcast = np.zeros((2, 1, 3, 5))
    assert _batch_blocks.take_block(broadcast, -1, slice(1, 3)) is broadcast
    assert _batch_blocks.take_block(None, -1, slice(0, 1)) is None


def test_run_blocks_waits_for_all_and_raises_the_first_error_in_block_order(fake_blas):
    fake_blas(2)
    done = []

    def fn(block):
        if block in (1, 2):
            raise ValueError(f"block {block}")
        done.append(block)

    with _batch_blocks.parallel_region(10, (8,)), pytest.raises(ValueError, match="^block 1$"):
        _batch_blocks.run_blocks(fn, [0, 1, 2, 3])
    assert sorted(done) == [0, 3]


def test_the_threads_end_with_the_region(fake_blas):
    fake_blas(3)
    q, k, v, mask = _case("batched")
    _fwd_bwd(q, k, v, mask)
    assert not [t for t in threading.enumerate() if t.name.startswith("attention_ref")]


def test_a_block_never_opens_a_region_of_its_own(fake_blas):
    fake_blas(2)
    seen = []

    def fn(block):
        with _batch_blocks.parallel_region(10, (8,)):
            seen.append((_batch_blocks.workers(), _batch_blocks.plan_blocks((8,))))

    with _batch_blocks.parallel_region(10, (8,)):
        _batch_blocks.run_blocks(fn, [0, 1])
    assert seen == [(0, None), (0, None)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [0, 1, 5, 40])
def test_matmul_in_row_blocks(fake_blas, dtype, m):
    fake_blas(2)
    rng = np.random.default_rng(m)
    a, b = rng.standard_normal((m, 6)).astype(dtype), rng.standard_normal((6, 7)).astype(dtype)
    with _batch_blocks.parallel_region(10, (8,)):
        for left in (a, np.asfortranarray(a)):
            got = _batch_blocks.matmul(left, b)
            assert got.dtype == dtype and got.shape == (m, 7)
            assert_close(got, left @ b, rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-5)
        got = _batch_blocks.matmul(b.T, a.T)  # a transposed left operand: rows are columns of b
        assert_close(got, b.T @ a.T, rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-5)


# ---------------------------------------------------------------- attention through the blocks
_CASES = {
    "batched": ((2, 3, 6, 4), (2, 3, 7, 4), (2, 3, 7, 5), None),
    "unbatched": ((6, 4), (7, 4), (7, 5), None),
    "broadcast q": ((1, 3, 6, 4), (2, 3, 7, 4), (2, 3, 7, 5), None),
    "broadcast k v": ((2, 3, 6, 4), (2, 1, 7, 4), (2, 1, 7, 5), None),
    "bool mask with batch": ((2, 3, 6, 4), (2, 3, 7, 4), (2, 3, 7, 5), ("bool", (2, 1, 6, 7))),
    "float mask": ((4, 6, 4), (4, 7, 4), (4, 7, 5), ("float", (6, 7))),
    "v and the mask add a batch axis": ((3, 6, 4), (3, 7, 4), (2, 3, 7, 5), ("bool", (2, 1, 6, 7))),
    "v adds a batch axis": ((3, 6, 4), (3, 7, 4), (2, 3, 7, 5), None),
}


def _case(name, dtype=np.float64, seed=0):
    q_shape, k_shape, v_shape, mask = _CASES[name]
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in (q_shape, k_shape, v_shape))
    if mask is not None:
        kind, shape = mask
        mask = rng.random(shape) < 0.7 if kind == "bool" else rng.standard_normal(shape)
        if kind == "bool":
            mask[..., 0] = True
    return q, k, v, mask


def _fwd_bwd(q, k, v, mask, dout_seed=9):
    out, cache = ar.scaled_dot_product_attention_forward(q, k, v, mask)
    dout = np.random.default_rng(dout_seed).standard_normal(out.shape).astype(out.dtype)
    return (out, cache.weights, *ar.scaled_dot_product_attention_backward(dout, cache))


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("name", list(_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_in_blocks_equals_one_piece(fake_blas, monkeypatch, name, dtype, threads):
    q, k, v, mask = _case(name, dtype)
    monkeypatch.setattr(_batch_blocks, "_blas_controller", lambda: None)
    expected = _fwd_bwd(q, k, v, mask)
    fake_blas(threads)
    got = _fwd_bwd(q, k, v, mask)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for what, a, b in zip(("out", "weights", "dq", "dk", "dv"), got, expected):
        assert a.dtype == dtype and a.shape == b.shape, what
        assert_close(a, b, rtol=tol, atol=tol, what=f"{name} {what}")


@pytest.mark.parametrize("name", ["batched", "broadcast k v", "bool mask with batch", "float mask"])
def test_gradients_through_the_blocks(fake_blas, name):
    fake_blas(2)
    q, k, v, mask = _case(name, seed=3)
    check_gradients(lambda q, k, v: ar.scaled_dot_product_attention_forward(q, k, v, mask),
                    ar.scaled_dot_product_attention_backward, q, k, v, names=["q", "k", "v"])


def test_blocks_run_on_the_pool_threads(fake_blas, monkeypatch):
    fake_blas(2)
    names = set()
    attend = attention_module._attend

    def spy(*args, **kwargs):
        names.add(threading.current_thread().name)
        return attend(*args, **kwargs)

    monkeypatch.setattr(attention_module, "_attend", spy)
    q, k, v, mask = _case("batched")
    ar.scaled_dot_product_attention_forward(q, k, v, mask)
    main = threading.current_thread().name
    assert main in names and {n for n in names if n != main} and all(
        n.startswith("attention_ref") for n in names - {main})  # the first block here, the others on the pool


def _message(q, k, v, mask=None):
    with pytest.raises(FloatingPointError) as error:
        ar.scaled_dot_product_attention_forward(q, k, v, mask)
    return str(error.value)


def test_overflow_in_a_block_is_named_as_in_one_piece(fake_blas, monkeypatch):
    q, k, v, _ = _case("batched")
    q[1, 2, 0, 0] = 1e160
    k[1, 2, :, 0] = 1e160
    mask = np.zeros((2, 3, 6, 7))
    mask[1, 2, 0, 0] = 1e308  # finite scores of 1e308 plus 1e308
    q2, k2, _, _ = _case("batched")
    q2[1, 2, 0] = [2e154, 0, 0, 0]
    k2[1, 2, 0] = [1e154, 0, 0, 0]
    monkeypatch.setattr(_batch_blocks, "_blas_controller", lambda: None)
    expected = [_message(q, k, v), _message(q2, k2, v, mask)]
    assert expected[0].startswith("overflow in the attention scores q k^T / sqrt(d_k)")
    assert "largest mask value 1e+308" in expected[1]
    fake_blas(2)
    assert [_message(q, k, v), _message(q2, k2, v, mask)] == expected


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_multi_head_through_the_blocks(fake_blas, num_kv_heads):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 6, 8))
    p = random_params(rng, 8, 4, 3, 2, num_kv_heads=num_kv_heads)
    mask = rng.random((6, 6)) < 0.8
    mask[:, 0] = True

    def forward(x, *weights):
        return ar.multi_head_attention_forward(x, x, x, dict(zip(p, weights)), 4, mask,
                                               num_kv_heads=num_kv_heads)

    def backward(dout, cache):
        dq, dk, dv, grads = ar.multi_head_attention_backward(dout, cache)
        return (dq + dk + dv, *grads.values())

    out_plain, cache_plain = forward(x, *p.values())
    dout = rng.standard_normal(out_plain.shape)
    plain = backward(dout, cache_plain)
    fake_blas(2)
    out, cache = forward(x, *p.values())
    assert_close(out, out_plain, what="out")
    assert_close(cache.weights, cache_plain.weights, what="weights")
    for a, b in zip(backward(dout, cache), plain):
        assert_close(a, b)
    check_gradients(forward, backward, x, *p.values())


# ---------------------------------------------------------------- the backward's query-row blocks
@pytest.mark.parametrize("name", list(_CASES))
def test_query_row_blocks_of_the_backward_equal_one_block(monkeypatch, no_blocks, name):
    q, k, v, mask = _case(name, seed=5)
    expected = _fwd_bwd(q, k, v, mask)
    for block in (1, 8, 30):  # one row per block and up; 7 keys: at most a few rows
        monkeypatch.setattr(attention_module, "QUERY_BLOCK_ELEMENTS", block)
        for a, b in zip(_fwd_bwd(q, k, v, mask), expected):
            assert_close(a, b, what=f"{name}, blocks of {block} numbers")


def test_gradients_through_query_row_blocks_and_batch_blocks(monkeypatch, fake_blas):
    fake_blas(2)
    monkeypatch.setattr(attention_module, "QUERY_BLOCK_ELEMENTS", 20)
    for name in ("bool mask with batch", "v adds a batch axis"):
        q, k, v, mask = _case(name, seed=6)
        check_gradients(lambda q, k, v: ar.scaled_dot_product_attention_forward(q, k, v, mask),
                        ar.scaled_dot_product_attention_backward, q, k, v, names=["q", "k", "v"])


def test_the_backward_makes_no_query_by_key_array_when_it_blocks(monkeypatch, no_blocks):
    """Each block's dP and dS live in one buffer of about QUERY_BLOCK_ELEMENTS numbers."""
    monkeypatch.setattr(attention_module, "QUERY_BLOCK_ELEMENTS", 2 * 7 * 3)
    q, k, v, _ = _case("batched")
    out, cache = ar.scaled_dot_product_attention_forward(q, k, v)
    shapes = []
    matmul = np.matmul

    def recording(a, b, out=None):
        result = matmul(a, b, out=out)
        shapes.append(result.shape)
        return result

    monkeypatch.setattr(attention_module.np, "matmul", recording)
    try:
        ar.scaled_dot_product_attention_backward(np.ones_like(out), cache)
    finally:
        monkeypatch.undo()
    assert (2, 3, 6, 7) not in shapes and (2, 3, 1, 7) in shapes


# ---------------------------------------------------------------- the real threadpoolctl
def test_real_threadpoolctl_limits_blas_inside_a_region(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if _batch_blocks._blas_controller() is None:
        pytest.skip("threadpoolctl finds no BLAS it can limit in this NumPy")

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]

    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        monkeypatch.setattr(_batch_blocks, "MIN_ELEMENTS", 0)
        with _batch_blocks.parallel_region(1, (8,)):
            assert blas_threads() == [1] * len(before)
            assert _batch_blocks.workers() == max(before)
        assert blas_threads() == before


def test_one_blas_thread_means_no_blocks(monkeypatch):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if _batch_blocks._blas_controller() is None:
        pytest.skip("threadpoolctl finds no BLAS it can limit in this NumPy")
    monkeypatch.setattr(_batch_blocks, "MIN_ELEMENTS", 0)
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        with _batch_blocks.parallel_region(1, (8,)):
            assert _batch_blocks.workers() == 0


def _in_child_after_fork_during_a_region(args):
    """In a child forked while another thread of the parent had a region open."""
    assert _batch_blocks._owner is None
    with _batch_blocks.parallel_region(10, (8,)):  # BLAS's threads are back: blocks again
        assert _batch_blocks.workers() == 2
    return _fwd_bwd(*args)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork is POSIX only")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_during_another_threads_region_runs_blocks(fake_blas):
    """Fork copies the region's owner but not the thread that would close it: the child
    must start free, and start threads of its own."""
    import multiprocessing

    fake_blas(2)
    q, k, v, mask = _case("batched")
    expected = _fwd_bwd(q, k, v, mask)
    inside, release = threading.Event(), threading.Event()

    def hold_a_region():
        with _batch_blocks.parallel_region(10, (8,)):
            inside.set()
            release.wait(60)

    holder = threading.Thread(target=hold_a_region)
    holder.start()
    assert inside.wait(10)
    try:
        context = multiprocessing.get_context("fork")
        with context.Pool(1) as pool:
            got = pool.apply_async(_in_child_after_fork_during_a_region, ((q, k, v, mask),)).get(timeout=30)
    finally:
        release.set()
        holder.join(10)
    for a, b in zip(got, expected):
        assert_close(a, b)


def test_blocks_keep_the_callers_floating_point_error_settings(fake_blas):
    """Threads start from NumPy's default error settings; a projection that overflows in a
    row block on a pool thread must be the named FloatingPointError, not a RuntimeWarning."""
    fake_blas(2)
    rng = np.random.default_rng(8)
    x = 1 + np.abs(rng.standard_normal((4, 6, 8)))
    p = random_params(rng, 8, 2, 4, 4)
    p["W_q"] = np.full_like(p["W_q"], 1e308)
    with pytest.raises(FloatingPointError, match=r"^overflow in query W_q \+ b_q"):
        ar.multi_head_attention_forward(x, x, x, p, 2)
    with _batch_blocks.parallel_region(10, (8,)), np.errstate(over="ignore"):
        assert np.isinf(_batch_blocks.matmul(np.full((8, 2), 1e200), np.full((2, 2), 1e200))).all()


def test_overflow_of_the_scores_is_named_before_a_masks_whatever_the_block(fake_blas, monkeypatch):
    """Item 0 overflows only with its float mask, item 1 in q k^T itself: one piece names the
    scores (step 1 checks every item before the mask is added), and so must the blocks."""
    q, k, v, _ = _case("batched")
    q[1, 0, 0] = [2e160, 0, 0, 0]
    k[1, 0, 0] = [1e160, 0, 0, 0]
    q[0, 0, 0] = [2e154, 0, 0, 0]
    k[0, 0, 0] = [1e154, 0, 0, 0]
    mask = np.zeros((2, 3, 6, 7))
    mask[0, 0, 0, 0] = 1e308
    monkeypatch.setattr(_batch_blocks, "_blas_controller", lambda: None)
    expected = _message(q, k, v, mask)
    assert expected.startswith("overflow in the attention scores q k^T")
    fake_blas(2)
    assert _message(q, k, v, mask) == expected


@pytest.mark.parametrize("shapes", [((2, 5, 3), (2, 0, 3), (2, 0, 4)), ((0, 5, 3), (0, 4, 3), (0, 4, 2)),
                                    ((2, 0, 3), (2, 4, 3), (2, 4, 2))])
def test_query_row_blocks_with_empty_axes(monkeypatch, no_blocks, shapes):
    monkeypatch.setattr(attention_module, "QUERY_BLOCK_ELEMENTS", 4)
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s) for s in shapes)
    out, cache = ar.scaled_dot_product_attention_forward(q, k, v)
    dq, dk, dv = ar.scaled_dot_product_attention_backward(np.ones_like(out), cache)
    assert (dq.shape, dk.shape, dv.shape) == shapes
    assert not dq.any() and not dk.any()  # no keys, no queries or no batch: nothing flows


def test_multi_head_through_the_blocks_in_float32(fake_blas, monkeypatch):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 6, 8)).astype(np.float32)
    p = random_params(rng, 8, 4, 3, 2, num_kv_heads=2, dtype=np.float32)

    def fwd_bwd():
        out, cache = ar.multi_head_attention_forward(x, x, x, p, 4, num_kv_heads=2)
        dq, dk, dv, grads = ar.multi_head_attention_backward(np.ones_like(out), cache)
        return (out, dq, dk, dv, *grads.values())

    monkeypatch.setattr(_batch_blocks, "_blas_controller", lambda: None)
    plain = fwd_bwd()
    fake_blas(2)
    for a, b in zip(fwd_bwd(), plain):
        assert a.dtype == np.float32
        assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_real_threadpoolctl_across_two_threads(monkeypatch):
    """threadpoolctl (3.8 and later) lets one thread at a time control OpenBLAS: a region
    closed in one thread must leave BLAS free for the next thread's region."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if _batch_blocks._blas_controller() is None:
        pytest.skip("threadpoolctl finds no BLAS it can limit in this NumPy")
    monkeypatch.setattr(_batch_blocks, "MIN_ELEMENTS", 0)

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    if max(before) < 2:
        pytest.skip("BLAS has one thread here")
    seen = []

    def region():
        with _batch_blocks.parallel_region(1, (8,)):
            seen.append((_batch_blocks.workers(), blas_threads()))

    for _ in range(2):  # another thread, then this one, then another again
        t = threading.Thread(target=region)
        t.start()
        t.join(30)
        region()
    assert seen == [(max(before), [1] * len(before))] * 4
    assert blas_threads() == before


@pytest.mark.parametrize("batch, opens", [((), False), ((1, 1), False), ((1, 2), False), ((2, 3), True),
                                          ((1, 8, 1), True)])
def test_region_opens_only_if_every_thread_gets_a_block(fake_blas, batch, opens):
    """Otherwise BLAS would sit on one thread while cores stay idle."""
    blas = fake_blas(3)
    with _batch_blocks.parallel_region(10, batch):
        assert _batch_blocks.workers() == (3 if opens else 0)
        assert blas.lib_controllers[0].num_threads == (1 if opens else 3)


def test_an_unbatched_call_keeps_blas_threads(fake_blas, monkeypatch):
    blas = fake_blas(2)
    seen = []
    attend = attention_module._attend

    def spy(*args, **kwargs):
        seen.append(blas.lib_controllers[0].num_threads)
        return attend(*args, **kwargs)

    monkeypatch.setattr(attention_module, "_attend", spy)
    q, k, v, _ = _case("unbatched")
    ar.scaled_dot_product_attention_forward(q, k, v)
    q, k, v, _ = _case("v adds a batch axis")
    ar.scaled_dot_product_attention_forward(q, k, v)
    assert seen == [2, 2]  # one piece, BLAS untouched


def test_only_numpys_own_openblas_is_used():
    class Library:
        def __init__(self, path):
            self.filepath = path

    join = __import__("os").path.join
    assert _batch_blocks._is_numpys(Library(join("x", "site-packages", "numpy.libs", "libscipy_openblas64_.so")))
    assert _batch_blocks._is_numpys(Library(join("x", "site-packages", "numpy", ".dylibs", "libopenblas.dylib")))
    assert not _batch_blocks._is_numpys(Library(join("x", "site-packages", "scipy.libs", "libopenblas.so")))
    assert not _batch_blocks._is_numpys(Library(join("usr", "lib", "libopenblas.so.0")))


def test_blocks_carry_an_errstate_callback(fake_blas):
    fake_blas(2)
    calls = []
    with _batch_blocks.parallel_region(10, (8,)), np.errstate(over="call", call=lambda *args: calls.append(args)):
        _batch_blocks.matmul(np.full((8, 2), 1e200), np.full((2, 2), 1e200))
    assert calls  # from the pool thread too, instead of a NameError there
