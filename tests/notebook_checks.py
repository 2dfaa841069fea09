"""The lessons' regression checks, kept out of the teaching cells.

For each notebook (by file stem), the code to run right after the code cell with the given id, in the same
kernel: ``tests/test_notebooks.py`` inserts each as a cell of its own after that cell, executes the notebook
and fails on any failed assertion; the inserted cells are never saved. A lesson keeps, in view, at most the
one check that is its idea (two computations agree); the printed values it shows are pinned here and by the
comparison of fresh outputs with the committed ones."""

CHECKS = {
    "01_scaled_dot_product_attention": {
        # issue 44: the trained tiny GPT's head that looks most at the previous character, and one query of it
        "a01e0002": """\
assert (layer, head) == (0, 2) and 0.3 < prev[0, 2] < 0.35 and prev[0, 2] > 5 * hs.uniform_baseline(np.arange(64) - 1)
assert len(text_ids) == 52 and maps[0].shape == (4, 52, 52)
""",
        "a01e0004": """\
assert (t, int(w.argmax())) == (37, 36) and 0.7 < w[36] < 0.8 and np.allclose(w, maps[layer][head, t, :t + 1])
assert abs(scores[36] - 5.09) < 0.01 and abs(np.exp(scores[36] - np.sort(scores)[-2]) - 11) < 0.5
""",
        "ed533ff3": """\
assert ob.shape == (4, 5, 3) and cb.weights.shape == (4, 5, 7)
""",
    },
    "02_why_scale_by_sqrt_dk": {
        "c92f3f1a": """\
assert abs(var_same / 128 - 1) < 0.05
""",
        "ab67dd2f": """\
import inspect
defaults = inspect.signature(ex.saturation).parameters
assert defaults["n_keys"].default == 8 and defaults["trials"].default == 500   # as the text says
assert all(0.25 < sc.max_weight < 0.45 and sc.grad_norm > 0.3 for _, sc in rows.values())
""",
        "57747c67": """\
assert rows[1024][0].max_weight > 0.97
""",
        "75c8d416": """\
assert norms[0] < norms[1] and 0.3 < norms[0] < 0.5                    # |J| first rises a little ...
assert norms[-1] < 0.05 * norms[0]                                     # ... then collapses
""",
        "3382a132": """\
assert np.sqrt(1024) == 32                     # the d_k of the [0, 32] example
""",
        "54b4c9f8": """\
_ref = ex.saturation(64, True)
assert abs(p.max(axis=-1).mean() - _ref.max_weight) < 1e-12 and abs(np.median(np.linalg.norm(J, axis=(1, 2))) - _ref.grad_norm) < 1e-12
""",
    },
    "03_masks": {
        "3f83d0f4": """\
assert pm.shape == (2, 1, 4)
""",
        "abb53143": """\
assert np.abs(ob[1, 2:]).max() > 0.1                     # not zero: a padded query attends like any other
assert moved > 0.1                                        # the filler would move the real tokens
""",
    },
    "04_multi_head_attention": {
        # issue 44: what each head of the trained tiny GPT attends to, as the reading cell says
        "a04e0002": """\
_s = {k: np.asarray(v) for k, v in scores.items()}
assert _s["the character itself"][0, 0] > 0.6 and _s["the character itself"][0, 1] > 0.5
assert np.unravel_index(_s["previous character"].argmax(), (2, 4)) == (0, 2)
assert abs(_s["previous character"][0, 2] / even["previous character"] - 5.4) < 0.1
assert np.unravel_index(_s["innermost open bracket"].argmax(), (2, 4)) == (1, 3)
assert 4.8 < _s["innermost open bracket"][1, 3] / even["innermost open bracket"] < 5.5
assert np.unravel_index(_s["last newline"].argmax(), (2, 4)) == (1, 3)
assert abs(_s["last newline"][1, 3] / even["last newline"] - 6.5) < 0.2
assert _s["innermost open bracket"][0, :2].max() < 0.02
""",
        "93b8b51b": """\
assert weights.shape == (2, 6, 6) and np.allclose(weights.sum(-1), 1)
assert [t.get_text() for t in fig.axes[0].texts] == [f"{w:.2f}" for w in weights[0].ravel()]
""",
    },
    "05_positions": {
        "51c87be2": """\
same = fig.axes[1].get_lines()[0].get_ydata()     # the right panel: a vector with itself
assert same[96:].mean() < 0.5 * same[0] and same[96:].mean() < same[1:33].mean()   # it decays, with wiggles:
                                                  # offsets 96-128 average below half the start
""",
    },
    "06_what_one_head_cannot_do": {
        "7d01c8fb": """\
assert search["n_queries"] == len(queries) == 23_600
""",
        "fffd3282": """\
assert np.allclose(weights[:3], weights[0]) and weights[3] < 0.01
""",
        "dda80054": """\
assert s.argmax() == 3
""",
        "6cd85e66": """\
assert (s1[2], s2[2]) == (5, 5) and (s1[0], s2[0]) == (10, 0)
assert np.minimum(s1, s2).argmax() == 2
""",
    },
    "07_backward_passes_and_gradcheck": {
        "b4db4cde": """\
assert sum(1 for a, _, _ in edges if a == "x") == 3      # x feeds three projections: three gradients add at x
""",
        "550c02b0": """\
assert report.ok and len(report.rows) == 3 + 8
""",
        "642cdd30": """\
assert round(terms) == 3 and abs(loss) < terms / 4
assert all(row.scale > 0.1 for name, row in rows.items() if name != "params[b_k]")  # real gradients
""",
        "d7c799dd": """\
assert not bad.ok and bad.rows[0].rel_err > 0.1
""",
        "096c5ef0": """\
e = np.e
assert np.allclose(cache1.weights, [[1 / (1 + e), e / (1 + e)]]) and abs(out1.item() - (1 + 3 * e) / (1 + e)) < 1e-12
assert np.allclose(dk1.ravel(), [-0.393224, 0.393224], atol=1e-6) and abs(dq1.item() - 0.393224) < 1e-6
assert np.allclose(dv1.ravel(), cache1.weights.ravel())
""",
    },
    "08_kv_cache_and_gqa": {
        "aad6cd91": """\
assert cache.keys.shape == (2, 4, T, 4)
""",
        "b8ccc32a": """\
assert per_sequence == 2 * 2**30
""",
        "56c7401d": """\
assert p["W_q"].shape == (d_model, h * d_k) and p["W_k"].shape == p["W_v"].shape == (d_model, h_kv * d_k)
""",
        "41454e7d": """\
assert rows[8][1] == 8 * rows[1][1]          # MQA's cache is h times smaller than MHA's
assert rows[8] == (16640, 32768) and rows[1] == (9360, 4096)
""",
        "c880c58f": """\
assert (round(-g[0], 2), round(changes[0], 2)) == (-1.95, -0.72)   # head 0, quoted below
""",
        "ff6d61e7": """\
assert w.shape == (6, 5, 5) and np.allclose(w.sum(axis=-1), 1)
""",
    },
    "09_blockwise_and_local_attention": {
        "7ba13c75": """\
assert shapes["row_max"] == shapes["log_row_sum"] == (2, 3, 100) and shapes["out"] == (2, 3, 100, 8)
""",
        "74494aaf": """\
assert 8192 * 8192 * 4 * 4 == 2**30      # the introduction's "1 GiB": n = 8192, 4 heads, float32
""",
        "44a16738": """\
assert (n_b, full, causal) == (5, n_b * n_b, n_b * (n_b + 1) // 2)
""",
        "a7181b2b": """\
# per query block: at most ceil((B + 2w) / B) + 1 = 3 key blocks, 2 at the two ends
per_block = np.bincount([qs // 50 for qs, ks in visited_tiles(n, n, 50, window=w)])
assert (band_tiles, full_tiles) == (3 * n_b - 2, n_b * n_b)
assert per_block.max() == -(-(50 + 2 * w) // 50) + 1 == 3 and per_block[0] == per_block[-1] == 2
# doubling n doubles the tiles (3 n_b - 2), where the full path would quadruple them
assert len(visited_tiles(2 * n, 2 * n, 50, window=w)) == 3 * (2 * n_b) - 2
""",
        "51295a43": """\
assert len(visited_tiles(32, 32, 8, causal=True)) == 10 and len(visited_tiles(32, 32, 8, window=4)) == 10
""",
        "419e8c20": """\
assert abs(l - np.exp(s - s.max()).sum()) < 1e-12 and m == s.max()
""",
    },
    "10_linear_attention": {
        "0b56f7ed": """\
assert cache.S.shape == (d, 4)
""",
        "3df72309": """\
assert round(gap, 2) == 0.75                 # far from zero: a different model
""",
        "33c34a0c": """\
assert round(plain_mib) == n * n * 8 / 2**20 + 2 * nd_mib == 130  # plain: the n x n weights (128 MiB),
                                                                # the output and the caller's copy of it
""",
        "135fc79c": """\
assert 0.3 < soft.weights.max() < 0.6 and 0.02 < linear_w.max() < 0.06
""",
    },
    "11_transformer_blocks": {
        "d2cf4f32": """\
assert round(d_exact[40], 2) == 0.5 and round(d_exact.min(), 3) == -0.129 and round(u[d_exact.argmin()], 1) == -1.4
assert d_exact[u < -0.8].max() < 0 < d_exact[u > -0.7].min()   # the sign change near -0.75
""",
        "92f33b8a": """\
assert n_params == 4 * (8 * 8 + 8) + 2 * 8 + (8 * 16 + 16 + 16 * 8 + 8) + 2 * 8
""",
        "72e86436": """\
assert np.abs(out_changed[:, 3] - out[:, 3]).max() > 0.1
""",
        "7bc0e248": """\
assert w_cross.shape == (2, 2, 4, 6)
""",
        "b6bea654": """\
assert report.ok and len(report.rows) == 2 + len(dp) == 28     # x, memory and 26 parameter arrays
""",
        "fe897be0": """\
assert 1e-2 < np.median(cos) < 0.1 and np.abs(dx_ln.mean(-1)).max() < 1e-12   # the last rows, std 0.01: far from orthogonal
""",
    },
    "13_training_two_heads": {
        "1a32f0ca": """\
# embedding + summary token + attention (4 projections) + 2 layer norms + FFN + read-out
D, F = 16, 32
assert sizes[1] == sizes[2] == (3 * D + D) + D + 4 * (D * D + D) + 2 * 2 * D + (D * F + F + F * D + D) + (D * 2 + 2)
""",
        "50cddfbc": """\
lib = {h: toy_task.train_toy_model(h, seed=0, epochs=EPOCHS) for h in (1, 2)}   # the library's loop: the same numbers
for h in (1, 2):
    assert np.allclose(lib[h].losses, results[h][1], rtol=1e-12) and abs(lib[h].final_loss - results[h][2]) < 1e-12
assert multi < 0.5 * single
assert 0.4375 - 0.02 < single < 1.15 * 0.4375 and results[1][1][-1] < 1.1 * 0.4375 and multi < 0.02
for _, losses, _ in results.values():
    assert len(losses) == EPOCHS and losses[0] > 1 and losses[-1] < 0.6 * losses[0]
""",
        "6b4355a7": """\
assert share1.max() > 0.8 and share1.min() < 0.3            # one head commits to one target
assert share2.max(axis=1).min() > 0.8
""",
        "f5e9ca34": """\
assert all(abs(e - 1) < 0.02 for e in [np.mean((w / (w**2 + (1 - w)**2) * (w * X + (1 - w) * Y) - X) ** 2) + np.mean(((1 - w) / (w**2 + (1 - w)**2) * (w * X + (1 - w) * Y) - Y) ** 2) for w in (1.0, 0.75, 0.5)])
""",
        "a7595d45": """\
assert np.abs(pred - toy_task.toy_model_forward(xb, params, 2)[0]).max() < 1e-12 and report.ok
""",
    },
    "14_whole_model": {
        "7544a06a": """\
D, V, F, n_layers = 16, 10, 32, 2                         # width, vocabulary, feed-forward, blocks
per_block = 4 * (D * D + D) + 2 * 2 * D + (D * F + F + F * D + D)  # attention, two layer norms, MLP
assert len(params) == 2 + 16 * n_layers + 2 and sum(p.size for p in params.values()) == V * D + 24 * D + n_layers * per_block + 2 * D == 5024
""",
        "11d8c16d": """\
assert abs(float(loss) - np.log(config.vocab_size)) < 0.05   # small random weights: nearly uniform
""",
        "c6e199cd": """\
assert not dW_lookup[0].any() and int((ids == 1).sum()) == 3
""",
        "b9008e48": """\
assert after < before and abs(before - np.log(10)) < 0.05     # it starts near ln V, as above
assert second_half == 1.0 and abs(losses[-1] - 7 / 15 * np.log(10)) < 0.1
""",
        # issue 44: the copy head fails at another period; the induction head, measured from the committed weights
        "a44c0de1": """\
assert copied < 0.3                                   # "near chance" (10%), where period 8 gave 100%
""",
        "c2d3e4f5": """\
for _name in ("two_layer", "one_layer"):               # the committed JSON is what these weights give
    _l, _c = ind.attention_only_forward(rows, models[_name], 2)
    assert np.allclose([induction_scores(w, rows) for w in _c.weights], run[_name]["induction"], rtol=1e-9)
    assert abs(ind.predictable_loss(_l, rows, periods) - run[_name]["repeat_loss"]) < 1e-9
assert min(run["two_layer"]["induction"][1]) > 0.85 > 0.3 > max(run["one_layer"]["induction"][0])
assert run["two_layer"]["repeat_loss"] < 0.25 and 2.0 < run["one_layer"]["repeat_loss"] < 2.3
assert first[0][0] > 0.9 and 0.4 < run["two_layer"]["previous_token"][0][0] < 0.5
_cut = run["ablation"]["layer 0 head 0"]
assert _cut["induction"][1][0] < 0.15 and _cut["repeat_loss"] > np.log(32) > 3.4
assert abs(induction_scores(cache_a.weights[1], rows)[0] - run["ablation"]["layer 0 head 1"]["induction"][1][0]) < 1e-9
assert max(run["two_layer"]["curve"]["best_induction"][:5]) < 0.3 < 0.8 < run["two_layer"]["curve"]["best_induction"][7]
""",
    },
    "15_model_families": {
        "4f0c067a": """\
assert params["self_attn.q_norm.weight"].shape == (8,) and params["self_attn.b_q"].shape == (32,)
assert set(grads) == set(params) and all(grads[k].shape == params[k].shape for k in params)
assert len(report.rows) == 1 + len(params) == 15                                       # x and 14 arrays
""",
        "50a0ab1f": """\
assert abs(np.abs(scores).max() - 75.5) < 0.05 and np.isclose(np.abs(capped).max(), 50 * np.tanh(np.abs(scores).max() / 50))
assert round(2 * np.pi / local[-1]) == 58470 and round(2 * np.pi / glob[-1]) == 5640335
""",
        "5fc41d07": """\
assert masks.max() == 2 and masks[11, 7] == 1 and masks[11, 8] == 2                     # key 7: global only
assert (ratio == 1).sum() == 29 and np.isclose(ratio, 1 / 8).sum() == 29
""",
        "807945c5": """\
assert len(qwen) == 1 + 2 * 11 + 1 and sum(p.size for p in qwen.values()) == 11 * 16 + 2 * (2 * 16 + (512 + 256 + 256 + 512) + 2 * 8 + 3 * 384) + 16  # embedding, blocks, final norm

assert abs(loss - 2.4348) < 1e-4 and abs(loss - np.log(11)) < 0.05 and set(grads) == set(qwen)
""",
        "b586c822": """\
assert abs(np.min(a_grid * sig_grid) + 0.2785) < 1e-3   # silu's minimum, -0.2785 at a = -1.278
""",
    },
    "16_real_models": {
        "57f39a5c": """\
assert params["self_attn.W_k"].shape == (16, 8) and all(r < 1e-10 for r in checks.values())
""",
        "3ff63765": """\
assert keys.shape == (2, 2, 1, 8, 4) and (np.triu(w, 1) == 0).all()
""",
        "fa8984e1": """\
a, b = (line.get_ydata() for line in fig.axes[0].get_lines()[:2])
same = fig.axes[1].get_lines()[0].get_ydata()
t = np.arange(len(same))
assert same[63] > 0.9 * same[0] and same.min() < -0.5 * same[0]  # periodic: back near offset 63
assert np.corrcoef(same, np.cos(t) + np.cos(t / 10))[0, 1] > 0.99  # about cos(t) + cos(t/10)


assert np.allclose(a, b, atol=1e-12)  # one curve from either start
assert 62 < 20 * np.pi < 63 and np.isclose(np.cos(20 * np.pi) + np.cos(2 * np.pi), 2)  # its period, 20 pi
""",
        "4f1d240d": """\
assert mistakes["none (the check above)"] < 1e-10 and gpt2_rel(True) < 1e-10
assert all(v > 1e-3 for k, v in mistakes.items() if k.startswith(("q_proj", "RoPE", "GPT-2")))
assert 1e-9 < mistakes["RMSNorm eps 1e-5, not the config's 1e-6"] < 1e-2
""",
    },
    "18_appendix_document_examples_and_errata": {
        "b6ede97c": """\
assert lsq["both"]["worst"] > 1.2 and lsq["head1"]["worst"] > 0.05        # not reproduced
assert lsq["head2"]["worst"] < 0.05                                        # reproduced within print precision
""",
        "14b30469": """\
verdicts = [c.verdict for c in rows]
assert verdicts.count("wrong") == 11 and verdicts.count("ambiguous") == 1 and verdicts.count("holds") == 3
""",
        "695cd194": """\
assert len(labels) == 12 and not np.allclose(printed, computed)
""",
        "ab2ffd99": """\
assert round(st.score, 4) == 0.1848 and round(0.45 / np.sqrt(3), 4) == 0.2598
assert st.alpha == 1.0 and np.allclose(st.output, [1, 2, 3])
""",
        "36fb3d5b": """\
assert readings["001"] == {"single": 3 * 512**2, "multi": 7 * 512**2}
assert readings["split"] == {"single": 4 * 512**2, "multi": 4 * 512**2}
""",
    },
    "19_attention_in_2025_26": {
        # issue 43's rule: the lesson shows, these check what it shows
        # issue 46: MLA's cache per token, the absorbed form, DeepSeek-V3's routing
        "m1a00002": """\
assert list(caches.values()) == [32 * 2 * 32 * 128, 32 * 2 * 8 * 128, 32 * 2 * 64, 61 * 576, 61 * 128 * 320]
_mla, _mha, _gqa = caches["DeepSeek-V3\\nMLA"], caches["DeepSeek-V3's heads\\nas MHA"], caches["Llama 3 8B\\nGQA, 8 kv heads"]
assert round(_mha / _mla) == 71 and 0.5 < _mla / _gqa < 0.55                     # "71 times", "about half"
assert fig.axes[0].get_xlabel() and len(fig.axes[0].patches) == 5
""",
        "m1a00004": """\
assert np.abs(prompt - plain[:, :5]).max() < 1e-14 and np.abs(step - plain[:, 5:]).max() < 1e-14
assert latent.c_hat.shape == (1, 6, 8) and latent.k_pe.shape == (1, 6, 4)
""",
        "m1a00006": """\
assert mla_report.ok and max(r.max_abs_err for r in mla_report.rows) < 1e-7
""",
        "m1a00008": """\
assert idx_ds[0].tolist() == [4, 7] and idx_b[0].tolist() == [3, 4]              # the text's token 0
_g = s[0] + bias
assert _g[2] + _g[3] > _g[6] + _g[7] and s[0, 7] > s[0, 3]                        # group 1 beats group 3
assert np.allclose(w_b[0], 2.5 * s[0, [3, 4]] / s[0, [3, 4]].sum(), rtol=1e-14)  # the unbiased scores as weights
""",
        "m1a00010": """\
assert routing_report.ok
""",
        # issue 47: the gated delta rule (section 5): what the state stores, the correction, the gate, the backward, the cost
        "d1900002": """\
assert np.allclose(keys @ keys.T, np.eye(3), atol=1e-14) and np.allclose(keys @ U, values, atol=1e-14)
_blend = sum(_v * (_k @ k_mid) for _k, _v in zip(keys, values))                 # U^T k = sum_j v_j (k_j . k)
assert np.allclose(U.T @ k_mid, _blend, atol=1e-14) and np.allclose(_blend, (values[0] + values[1]) / np.sqrt(2), atol=1e-14)
""",
        "d1900004": """\
_loss = lambda _U: 0.5 * np.sum((_U.T @ k0 - v_new) ** 2)
assert np.allclose(grad, ar.numerical_gradient(_loss, U_prev), atol=1e-8)       # the gradient the text derives
assert np.abs(one.final_state - (U_prev - eta * grad)).max() < 1e-14
assert np.allclose(U_plain.T @ k0, v_old + v_new, atol=1e-14) and np.allclose(two.final_state.T @ k0, v_new, atol=1e-14)
assert np.allclose(two.final_state, np.outer(k0, v_new), atol=1e-14)
""",
        "d1900006": """\
_err = np.array([np.linalg.norm(reg.states[t] - W_true) for t in range(T_reg + 1)])
assert _err[200] < 1e-9 and _err[50] < 1e-2 and _err[10] < 1 and np.all(_err[20::20] < _err[:-20:20])   # falls steadily
_sums = np.linalg.norm(U_sum - W_true, axis=(1, 2))
assert np.all(np.diff(_sums[9::10]) > 0) and 0.8 < _sums[-1] / (200 / 4 * np.linalg.norm(W_true)) < 1.2   # ~ (t / d_k) |W|
assert abs(_err[200] - 5.0e-11) < 5e-12 and abs(_sums[-1] - 199.25) < 0.005                               # as printed
""",
        "d1900008": """\
assert np.allclose(keys @ U3, values, atol=1e-14)
_e = keys @ edit.final_state
assert np.allclose(_e[0], 0, atol=1e-14) and np.allclose(_e[1:], values[1:], atol=1e-14)    # one direction changed
assert np.allclose(keys @ gate.final_state, 0.1 * values, rtol=1e-13, atol=1e-15)            # every direction scaled
_a, _eta, _k, _v = 0.7, 0.4, keys[1], rng_d.standard_normal(d_v)                             # the next cell's formula
_, _c = ar.gated_delta_rule_forward(_k[None], _k[None], _v[None], np.log([_a]), np.array([_eta]), U3, qk_l2norm=False)
assert np.allclose(_c.final_state, _a * (np.eye(d_k) - _eta * np.outer(_k, _k)) @ U3 + _eta * np.outer(_k, _v), atol=1e-14)
""",
        "d1900010": """\
assert delta_report.ok and max(r.max_abs_err for r in delta_report.rows) < 1e-7
# the lesson's backward steps 5..1, as written, against the package's backward (unit keys, no normalisation)
_kn = k_g / np.linalg.norm(k_g, axis=-1, keepdims=True)
_qn = q_g / np.linalg.norm(q_g, axis=-1, keepdims=True) / np.sqrt(d_k)
_o, _c = ar.gated_delta_rule_forward(_qn, _kn, v_g, g_g, eta_g, U0_g, scale=1.0, qk_l2norm=False)
_do = rng_d.standard_normal(_o.shape)
_ref = ar.gated_delta_rule_backward(_do, _c)
for _b in range(2):
    _dU, _a = np.zeros((d_k, d_v)), np.exp(g_g[_b])
    _dq, _dk, _dv, _dg, _deta = np.zeros((T_g, d_k)), np.zeros((T_g, d_k)), np.zeros((T_g, d_v)), np.zeros(T_g), np.zeros(T_g)
    for _t in reversed(range(T_g)):
        _Uprev, _Ut, _k, _q = _c.states[_b, _t], _c.states[_b, _t + 1], _kn[_b, _t], _qn[_b, _t]
        _Ubar = _a[_t] * _Uprev
        _delta = v_g[_b, _t] - _Ubar.T @ _k
        _dU = _dU + np.outer(_q, _do[_b, _t]); _dq[_t] = _Ut @ _do[_b, _t]                        # 5. read
        _dUbar = _dU; _dk[_t] = eta_g[_b, _t] * _dU @ _delta                                      # 4. write
        _ddelta = eta_g[_b, _t] * _dU.T @ _k; _deta[_t] = _k @ _dU @ _delta
        _dv[_t] = _ddelta; _dvhat = -_ddelta                                                      # 3. error
        _dUbar = _dUbar + np.outer(_k, _dvhat); _dk[_t] += _Ubar @ _dvhat                        # 2. recall
        _dg[_t] = _a[_t] * np.sum(_dUbar * _Uprev); _dU = _a[_t] * _dUbar                        # 1. decay
    for _mine, _theirs in zip((_dq, _dk, _dv, _dg, _deta, _dU), _ref):
        assert np.allclose(_mine, _theirs[_b], rtol=1e-12, atol=1e-14)
""",
        "d1900012": """\
assert d == 128 and np.allclose(costs["3 delta + 1 softmax (per layer)"], (3 * 4 * d * d + 2 * n * d) / 4)
_s, _l = costs["softmax attention"], costs["delta rule"]
assert np.all(_s[n < 255] < _l[n < 255]) and np.all(_s[n > 257] > _l[n > 257])              # crossover at n = 2d = 256
_ms, _ml = memory["softmax attention"], memory["delta rule"]
assert np.all(_ms[n < 63] < _ml[n < 63]) and np.all(_ms[n > 65] > _ml[n > 65])              # the state smaller from d/2 = 64
for _n, _ratio in ((64, 0.25), (256, 1.0), (4096, 16.0), (262144, 1024.0)):
    assert 2 * _n * d / (4 * d * d) == _ratio == _n / (2 * d)
assert decoded.final_state.shape == (d, d) and decoded.final_state.size == 16384 == d * d
assert ax_c.get_xlabel() and ax_c.get_ylabel() and ax_m.get_ylabel() and len(ax_c.lines) == 4 and len(ax_m.lines) == 3
""",
        "1f82b371": """\
assert np.allclose(P[0, 0, :3], e[:3] / e.sum(), rtol=1e-14) and abs(cache.p_sink[0, 0, 0] - e[3] / e.sum()) < 1e-15
for _sink, _on_keys, _on_sink in ((-4.0, 0.9984, 0.0016), (0.0, 0.9216, 0.0784), (2.0, 0.6141, 0.3859)):
    _P, _c = ar.sink_softmax_forward(scores, np.array([_sink]))
    assert abs(_P[0, 0].sum() - _on_keys) < 1e-4 and abs(_c.p_sink[0, 0, 0] - _on_sink) < 1e-4
    assert abs(_P[0, 0].sum() + _c.p_sink[0, 0, 0] - 1) < 1e-15 and _P[0, 0, 3] == 0
    assert _P[0, 1].sum() == 0 and _c.p_sink[0, 1, 0] == 1                 # the fully masked row: all on the sink
""",
        "391273f1": """\
assert np.allclose(on_keys, logistic, rtol=1e-13, atol=1e-15) and abs(lse - 2.4644) < 1e-4
assert abs(ar.sink_softmax_forward(scores[:, :1], np.array([lse]))[0].sum() - 0.5) < 1e-14
assert fig.axes[0].get_xlabel() and fig.axes[0].get_ylabel()
""",
        "f5895d9d": """\
assert np.allclose(ds, P * (dP - c), rtol=1e-14, atol=1e-15)
assert np.allclose(dsig, (-cache.p_sink * c).sum(axis=(0, 2, 3)), rtol=1e-14, atol=1e-15)
assert sink_report.ok and max(r.max_abs_err for r in sink_report.rows) < 1e-6
""",
        "4a21ce31": """\
assert abs(alpha - (0.1 * math.log(32) + 1)) < 1e-15 and abs(alpha - 1.3466) < 1e-4 and (kept, slowed) == (9, 14)
assert abs(low - 8.09) < 0.01 and abs(high - 17.40) < 0.01
assert kept == math.ceil(low) and slowed == 32 - math.ceil(high)   # the ramp runs from pair low to pair high
_i = np.arange(32)
_rho = np.clip((_i - low) / (high - low), 0, 1)
assert np.allclose(theta_yarn, (1 - _rho) * theta + _rho * theta / 32, rtol=1e-13)   # the lesson's formula
assert fig.axes[0].get_xlabel() and fig.axes[0].get_ylabel()
""",
        "7340c2a7": """\
assert abs(np.linalg.norm(y) / np.linalg.norm(x) - alpha) < 1e-12
assert yarn_report.ok and max(r.max_abs_err for r in yarn_report.rows) < 1e-6
""",
        "a5aea03e": """\
assert np.allclose(w.sum(-1), 1) and np.allclose(y[0], one, rtol=1e-13, atol=1e-13)
assert [idx[t].tolist() for t in range(3)] == [[0, 3], [1, 2], [1, 2]]
assert np.array_equal(np.sort(idx, -1), np.sort(np.argsort(-logits, -1)[:, :k], -1))    # the k largest logits
_top = np.take_along_axis(logits, idx, -1)
assert np.allclose(w, np.exp(_top) / np.exp(_top).sum(-1, keepdims=True), rtol=1e-14)   # softmax over the k chosen
assert abs(w[0, 0] - 0.967) < 5e-4 and abs(w[1, 0] - 0.978) < 5e-4 and abs(w[2, 0] - 0.733) < 5e-4
""",
        "d982714a": """\
assert abs((top[:, 1] - top[:, 2]).min() - 0.250) < 5e-4 and np.abs(np.abs(gu) - 7).min() > 1e-3
assert int((gu[..., 0::2] > 7).sum() + (np.abs(gu[..., 1::2]) > 7).sum()) == 2
assert moe_report.ok and max(r.max_abs_err for r in moe_report.rows) < 1e-6
""",
        "0c423f83": """\
assert abs(uniform - 2) < 1e-15 and abs(skewed - 4 * (1.0 * p[0] + 1.0 * p[1])) < 1e-12   # f = (1, 1, 0, 0)
assert abs(skewed - 3.7286) < 1e-4
_dp = 4 * np.array([1.0, 1.0, 0.0, 0.0]) / 8                                 # dp_te = E f_e / T
assert np.allclose(dl, np.tile(p * (_dp - p @ _dp), (8, 1)), rtol=1e-13)    # softmax's backward per token
assert dl[0, 0] > dl[0, 1] > 0 > dl[0, 2] == dl[0, 3]
assert lb_report.ok and max(r.max_abs_err for r in lb_report.rows) < 1e-6
""",
    },
    "20_does_my_port_match": {
        # issue 40's lesson: the checkpoint, each verdict's where / mistake / error, and the sizes the prose states
        "b20c0002": """\
assert (config["num_attention_heads"], config["num_key_value_heads"], config["num_hidden_layers"]) == (4, 2, 2)
assert config["rms_norm_eps"] == 1e-6 and config["rope_theta"] == 500000.0
""",
        "b20c0006": """\
_d, _r = np.abs(ours - reference).max(), np.abs(reference).max()
assert 0.05 < _d < 0.2 and 0.2 < _r < 0.5 and 0.2 < _d / _r < 0.45      # "up to about a third of the largest logit"
""",
        "b20c0007": """\
assert not verdict.ok and verdict.mistake == "rms_norm_eps" and verdict.where == "model.layers.0.input_layernorm"
assert 1 < verdict.error < 2
_ms = float(np.mean(params["embed_tokens"] ** 2))
assert 3e-4 < _ms < 5e-4                                                 # "about 0.02, mean square about 4e-4"
assert 0.005 < np.sqrt((_ms + 1e-5) / (_ms + 1e-6)) - 1 < 0.02            # "about 1%"
""",
        "b20c0008": """\
assert not verdict.ok and verdict.mistake is None and verdict.where == "model.layers.0.self_attn"
assert "model.layers.0.self_attn.o_proj" in verdict.detail and 1 < verdict.error < 2
""",
        "b20c0009": """\
assert verdict.mistake == "rope_theta" and verdict.where == "self_attn.o_proj"
assert verdict.cases == verdict.failed == 5 and 0.01 < verdict.error < 0.03
""",
        "b20c0010": """\
assert compare.module(Attention(no_groups), no_groups, "attention").ok
assert verdict.mistake == "gqa_head_order" and verdict.where == "self_attn.o_proj" and 1 < verdict.error < 1.5
assert errors["attention, no groups"] == min(e for e in errors.values())     # the smallest failing verdict
""",
        "b20c0011": """\
assert compare.module(Attention(config), config, "attention").ok
assert verdict.ok and verdict.mistake is None and verdict.cases == 2 and verdict.error < 1e-14
""",
        "b20c0012": """\
assert np.abs(ours - reference).max() < 1e-14 and len(ax.patches) == len(errors) == 5
""",
    },
}
