"""Every figure function, rendered with Agg: it draws something, no text falls outside the
canvas (a clipped colorbar label or legend), and a figure title never runs into a panel title."""
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attention_ref import plot
from attention_ref.plot import training



def _rng():
    """A fresh generator per case: a figure's data never depends on which cases ran before."""
    return np.random.default_rng(0)


def _induction_case():
    """A result shaped as examples/induction_heads.py writes it, for an untrained model."""
    from attention_ref.documents import induction as ind

    ids, _ = ind.repeated_sequences(_rng(), 1)
    params = ind.init_attention_only_params()
    scores = {"induction": [[0.1, 0.2], [0.9, 0.3]], "previous_token": [[0.4, 0.1], [0.0, 0.1]]}
    result = {"settings": {"num_heads": 2},
              "two_layer": {"curve": {"step": [50, 100], "best_induction": [0.1, 0.9]}, **scores},
              "one_layer": {"curve": {"step": [50, 100], "best_induction": [0.1, 0.2]}},
              "ablation": {"none": scores, "layer 0 head 0": {"induction": [[0, 0], [0.1, 0.2]]},
                           "layer 0 head 1": {"induction": [[0, 0], [0.8, 0.3]]}}}
    return result, {"two_layer": params}, ids[0]


CASES = {
    **{f"{builder.__name__} ({name})": builder for name, builder in plot.FIGURES.items()},
    "attention_heatmaps, 8 heads of 8 tokens": lambda: plot.attention_heatmaps(
        _rng().dirichlet(np.ones(8), size=(8, 8)), [f"token{i}" for i in range(8)]),
    "attention_heatmaps, 6 heads with long titles": lambda: plot.attention_heatmaps(
        _rng().dirichlet(np.ones(5), size=(6, 5)), [f"t{i}" for i in range(5)],
        panel_titles=[f"head {i + 1} (kv head {i // 3 + 1})" for i in range(6)], title="a long figure title " * 3),
    "attention_heatmaps, unlabelled 30 x 40": lambda: plot.attention_heatmaps(
        _rng().dirichlet(np.ones(40), size=(2, 30)), panel_titles=["softmax", "linear (elu + 1)"]),
    "tile_maps": lambda: plot.tile_maps(40, 56, 8, rules=({"causal": True}, {"window": 5}, {"causal": True, "window": 9})),
    "softmax_jacobians": lambda: plot.softmax_jacobians(_rng().dirichlet(np.ones(7))),
    "rope_scores_by_offset": lambda: plot.rope_scores_by_offset(d=16, max_offset=40, pairs=8),
    "printed_vs_computed": lambda: plot.printed_vs_computed([f"Q{i}[{j}]" for i in range(3) for j in range(4)],
                                                            _rng().random(12), _rng().random(12)),
    "plot_attention_heads, 2 layers of 4 heads on 20 bytes": lambda: plot.plot_attention_heads(
        list(_rng().dirichlet(np.ones(20), size=(2, 4, 20))), plot.byte_labels(b"def f(x):\n    return"[:20]),
        scores=_rng().random((2, 4)), score_name="previous token", title="a tiny GPT"),
    "plot_attention_heads, one chosen head on 52 bytes": lambda: plot.plot_attention_heads(
        list(_rng().dirichlet(np.ones(52), size=(2, 4, 52))), plot.byte_labels(b"\n    elif len(key) == 1 and x[0]:" * 2)[:52],
        heads=[(0, 2)], title="one head"),
    "plot_head_scores": lambda: plot.plot_head_scores({"previous token": _rng().random((2, 4)),
                                                       "open bracket": _rng().random((2, 4))},
                                                      baselines={"previous token": 0.1}, title="scores"),
    "plot_qkv": lambda: plot.plot_qkv(_rng().standard_normal(16), _rng().standard_normal((9, 16)),
                                      _rng().standard_normal((9, 16)), plot.byte_labels(b"(a, b[1])"),
                                      title="one query"),
    "plot_induction": lambda: plot.plot_induction(*_induction_case()),
    "training.plot_loss_curves": lambda: training.plot_loss_curves({"one head": [1, 0.5, 0.4], "two heads": [1, 0.1, 0.01]}),
    "training.plot_attention_maps": lambda: training.plot_attention_maps(
        {"1 head: head 0": _rng().random((6, 5)), "2 heads: head 0": _rng().random((6, 5)),
         "2 heads: head 1": _rng().random((6, 5))}, _rng().random((6, 5, 3))),
}


def test_every_public_figure_function_is_rendered_here():
    names = " ".join(CASES)
    for function in plot.__all__ + training.__all__:
        if function in ("save_all", "FIGURES", "example_attention_weights", "byte_labels"):  # not figures
            continue
        assert function in names, f"{function} has no case in test_figure_layout"


@pytest.mark.parametrize("name", list(CASES))
def test_figure_draws_inside_its_canvas(name):
    fig = CASES[name]()
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    pixels = np.asarray(canvas.buffer_rgba())
    assert pixels.std() > 10, "the figure is blank"
    width, height = fig.get_size_inches()
    box = fig.get_tightbbox(renderer)  # inches; everything drawn, text included
    assert box.x0 >= -0.01 and box.y0 >= -0.01 and box.x1 <= width + 0.01 and box.y1 <= height + 0.01, \
        f"drawn outside the {width:.2f} x {height:.2f} in canvas: {tuple(round(v, 2) for v in box.extents)}"
    if fig._suptitle is not None and fig._suptitle.get_text():
        top = fig._suptitle.get_window_extent(renderer)
        for ax in fig.axes:
            if ax.title.get_text():
                assert not top.overlaps(ax.title.get_window_extent(renderer)), \
                    f"the figure title runs into {ax.title.get_text()!r}"


def test_random_weights_say_so():
    fig = plot.FIGURES["attention_heads.png"]()
    assert "random weights" in fig._suptitle.get_text()
