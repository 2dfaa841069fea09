"""The figures render under Agg, return a Figure, never show, and never touch pyplot."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from attention_ref import plot  # noqa: E402


def test_core_package_does_not_import_matplotlib():
    code = "import sys, attention_ref; assert 'matplotlib' not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_attention_heatmaps_one_panel_per_head(tmp_path):
    tokens, weights = plot.example_attention_weights()
    assert weights.shape == (2, 6, 6)
    np.testing.assert_allclose(weights.sum(-1), 1.0)
    assert np.all(np.triu(weights, 1) == 0)  # causal: nothing above the diagonal
    fig = plot.attention_heatmaps(weights, tokens)
    assert isinstance(fig, Figure)
    heads = [ax for ax in fig.axes if ax.get_title().startswith("head")]
    assert [ax.get_title() for ax in heads] == ["head 1", "head 2"]
    assert [t.get_text() for t in heads[0].get_yticklabels()] == tokens
    assert len(heads[0].texts) == 36  # one annotation per cell
    fig.savefig(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000
    assert plt.get_fignums() == []  # no pyplot state


def test_attention_heatmaps_single_head_and_bad_labels():
    fig = plot.attention_heatmaps(np.full((2, 3), 1 / 3), ["a", "b"], ["x", "y", "z"])
    assert sum(ax.get_title() == "head 1" for ax in fig.axes) == 1
    with pytest.raises(ValueError, match="labels"):
        plot.attention_heatmaps(np.full((2, 3), 1 / 3), ["a"])
    with pytest.raises(ValueError, match="shape"):
        plot.attention_heatmaps(np.ones(3), ["a"])


def test_saturation_curves_small():
    fig = plot.saturation_curves(d_ks=(1, 16, 256))
    a, b, c = fig.axes
    unscaled = b.get_lines()[0].get_ydata()
    assert unscaled[0] < unscaled[-1] > 0.9  # the largest weight climbs towards 1
    grad_unscaled, grad_scaled = (line.get_ydata() for line in c.get_lines()[:2])
    assert grad_unscaled[-1] < 1e-2 < grad_scaled[-1]
    fig.canvas.draw()


def test_convex_hull_and_spectra(tmp_path):
    fig = plot.convex_hull()
    left, right = fig.axes
    scores = [line.get_ydata() for line in right.get_lines()]
    np.testing.assert_allclose(scores[2], (scores[0] + scores[1]) / 2, atol=1e-12)  # k3 = mean
    fig = plot.singular_value_spectra(scales=(1.0,), n=16, d_k=4)
    sv = fig.axes[0].get_lines()[0].get_ydata()
    assert len(sv) == 16 and np.all(np.diff(sv) <= 1e-12)


def test_save_all(tmp_path):
    paths = plot.save_all(tmp_path, ["convex_hull.png", "singular_values.png"])
    assert [p.name for p in paths] == ["convex_hull.png", "singular_values.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    assert set(plot.FIGURES) == {"attention_heads.png", "saturation.png", "convex_hull.png",
                                 "singular_values.png"}


def test_tile_maps_titles_count_the_visited_tiles():
    from attention_ref.variants.blockwise import visited_tiles

    fig = plot.tile_maps(20, 28, 4, rules=({"causal": True}, {"window": 3}))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [f"causal=True: {len(visited_tiles(20, 28, 4, causal=True))} of 35 tiles",
                      f"window=3: {len(visited_tiles(20, 28, 4, window=3))} of 35 tiles"]
    hatched = [p for p in fig.axes[0].patches if p.get_hatch()]
    assert len(hatched) == 35 - len(visited_tiles(20, 28, 4, causal=True))


def test_softmax_jacobians_show_the_formula():
    y = np.array([0.1, 0.2, 0.7])
    fig = plot.softmax_jacobians(y)
    full, diagonal = (ax.images[0].get_array() for ax in fig.axes[:2])
    np.testing.assert_allclose(full, np.diag(y) - np.outer(y, y))
    np.testing.assert_allclose(diagonal, np.diag(y * (1 - y)))


def test_rope_scores_depend_on_the_offset_only():
    fig = plot.rope_scores_by_offset(d=8, max_offset=10, pairs=4, starts=(0, 7))
    from_zero, from_seven = (line.get_ydata() for line in fig.axes[0].get_lines()[:2])
    np.testing.assert_allclose(from_seven, from_zero, rtol=1e-10, atol=1e-12)  # the same curve from any start
    same = fig.axes[1].get_lines()[0].get_ydata()
    assert len(same) == 11 and same[0] == pytest.approx(np.max(same))  # a vector is closest to itself at offset 0


def test_bad_labels_and_titles_are_named():
    with pytest.raises(ValueError, match="3 labels for 2 printed and 2 computed values"):
        plot.printed_vs_computed(["a", "b", "c"], [1, 2], [1, 2])
    with pytest.raises(ValueError, match="1 panel titles for 2 panels"):
        plot.attention_heatmaps(np.full((2, 3, 3), 1 / 3), panel_titles=["one"])
