"""attention_ref.plot.heads: every panel has labelled axes with the tokens as tick labels, the chosen heads are the
ones drawn, plot_qkv draws the weights of the formula, and bad input is refused by name."""
import numpy as np
import pytest

from attention_ref import plot


def _weights(layers=2, heads=3, T=5, seed=0):
    return list(np.random.default_rng(seed).dirichlet(np.ones(T), size=(layers, heads, T)))


def test_byte_labels_show_spaces_and_newlines():
    assert plot.byte_labels(b"a b\n\t(\x01") == ["a", "␣", "b", "\\n", "\\t", "(", "x01"]


def test_every_panel_has_token_ticks_and_axis_labels():
    labels = plot.byte_labels(b"f(x)\n")
    fig = plot.plot_attention_heads(_weights(), labels, scores=np.arange(6).reshape(2, 3) / 10, score_name="prev")
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"][:6]
    assert [ax.get_title() for ax in panels][:2] == ["layer 0, head 0\nprev 0.00", "layer 0, head 1\nprev 0.10"]
    for ax in panels:
        assert [t.get_text() for t in ax.get_xticklabels()] == labels == [t.get_text() for t in ax.get_yticklabels()]
        assert "key" in ax.get_xlabel() and "query" in ax.get_ylabel()


def test_chosen_heads_are_drawn():
    w = _weights()
    fig = plot.plot_attention_heads(w, list("abcde"), heads=[(1, 2), (0, 0)])
    assert [ax.get_title() for ax in fig.axes[:2]] == ["layer 1, head 2", "layer 0, head 0"]
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array(), w[1][2])
    with pytest.raises(ValueError, match="heads must be"):
        plot.plot_attention_heads(w, list("abcde"), heads=[(2, 0)])


def test_qkv_draws_the_formula():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal(4), rng.standard_normal((3, 4)), rng.standard_normal((3, 2))
    fig = plot.plot_qkv(q, k, v, ["a", "b", "c"])
    s = k @ q / 2.0
    w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    bars = [p.get_width() for p in fig.axes[2].patches]
    np.testing.assert_allclose(bars, w, rtol=1e-12)
    np.testing.assert_allclose(fig.axes[3].images[0].get_array()[-1], w @ v, rtol=1e-12)


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="weights must be"):
        plot.plot_attention_heads([np.ones((3, 3))], list("abc"))
    with pytest.raises(ValueError, match="2 labels for 5 positions"):
        plot.plot_attention_heads(_weights(), ["a", "b"])
    with pytest.raises(ValueError, match="q \\(d_k,\\), k \\(n, d_k\\), v \\(n, d_v\\) expected"):
        plot.plot_qkv(np.ones(3), np.ones((2, 4)), np.ones((2, 2)), ["a", "b"])
    with pytest.raises(ValueError, match="1 labels for 2 keys"):
        plot.plot_qkv(np.ones(4), np.ones((2, 4)), np.ones((2, 2)), ["a"])
