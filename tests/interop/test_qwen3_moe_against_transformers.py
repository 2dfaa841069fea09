"""Qwen3-MoE whole (attention_ref/models/families/qwen3_moe.py) against transformers' ``Qwen3MoeForCausalLM``:
built from a small config with random weights in float64, written by ``save_pretrained`` (one tensor per expert,
on 4.57 and 5.x alike) and read by our ``load_pretrained``; logits, the loss and the gradient of every parameter
at 1e-10 relative; ``to_transformers`` of the weights; ``generate`` token for token on a left-padded batch; each
decoding step's logits against transformers' own cache; the config fields that change the numbers and are not
computed, refused by name.

The small model: 3 layers, layer 0 dense by ``mlp_only_layers`` (width ``intermediate_size`` 24), layers 1 and 2
with 4 experts of width ``moe_intermediate_size`` 12, of which each token takes 2 (``norm_topk_prob`` True and,
in one test, False and ``decoder_sparse_step`` 2), head width 6 (not hidden / heads). Its routing is checked for
near ties: the gap between each real token's k-th and (k+1)-th router logit, in every sparse layer, must be at
least ``GAP`` of the logits' scale (else the inputs are drawn again), so that no rounding at 1e-15 can choose
another expert in one implementation than in the other.

transformers' float32 steps inside a float64 model, run here as the same formulas in float64:
* the RMSNorms' cast to float32 (``Qwen3MoeRMSNorm``, the q/k norms included) and the RoPE angles
  (``Qwen3MoeRotaryEmbedding``): :func:`attention_ref.interop.llama_in_float64` (the family's ``float32_steps``);
* the router's softmax (``dtype=torch.float``): :func:`attention_ref.interop.moe_models_in_float64`
  (4.57: ``Qwen3MoeSparseMoeBlock.forward``, its router lines and its loop over the experts; 5.x:
  ``Qwen3MoeTopKRouter.forward``).
The attention is SDPA (float64 throughout); 5.x's experts run their eager loop (its default grouped_mm refuses
float64; 4.57 has only the loop). One test switches ``use_sliding_window`` on (a window of 3 on every layer). The ``labels=`` loss (``logits.float()``) is compared at 1e-6; the float64 loss
is the same shifted cross-entropy on the float64 logits. transformers' loss is the language-modelling loss alone
(``output_router_logits`` False), as ``lm_loss``'s.
"""
import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attention_ref as ar  # noqa: E402
from attention_ref.interop import llama_in_float64, load_pretrained, moe_models_in_float64, to_transformers  # noqa: E402
from _transformers_api import returned_cache, with_cache  # noqa: E402

FIVE = int(transformers.__version__.split(".")[0]) >= 5
RTOL = 1e-10
#: the smallest gap between a token's k-th and (k+1)-th router logit, relative to the logits' scale
GAP = 1e-6
ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}} if FIVE else {"rope_theta": 500.0}
SMALL = dict(vocab_size=41, hidden_size=16, intermediate_size=24, moe_intermediate_size=12, num_attention_heads=4,
             num_key_value_heads=2, head_dim=6, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
             norm_topk_prob=True, mlp_only_layers=[0], max_position_embeddings=64, rms_norm_eps=1e-6, pad_token_id=0,
             bos_token_id=None, eos_token_id=None, attn_implementation="sdpa", **ROPE,
             **({"experts_implementation": "eager"} if FIVE else {}))


@contextlib.contextmanager
def in_float64():
    with llama_in_float64(), moe_models_in_float64():
        yield


def _close(ours, theirs, what):
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours) - theirs).max())
    assert err <= RTOL * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


def _model(tie=False, **fields):
    config = transformers.Qwen3MoeConfig(**{**SMALL, **fields}, tie_word_embeddings=tie)
    model = transformers.Qwen3MoeForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # norms away from 1, the router (zero at init in 5.x) random
            p.add_(0.3 * torch.randn_like(p)) if "norm" in name else p.copy_(0.5 * torch.randn_like(p))
    return model


def _routing_gap(model, ids, mask):
    """The smallest gap between the k-th and (k+1)-th router logit of a real token, over every sparse
    layer, relative to the largest logit (forward hooks on each ``mlp.gate``'s input)."""
    k = model.config.num_experts_per_tok
    gaps, handles = [], []
    keep = torch.as_tensor(mask).reshape(-1).bool()

    def hook(gate, args, output):
        logits = torch.nn.functional.linear(args[0].reshape(-1, gate.weight.shape[1]), gate.weight)
        top = logits[keep].sort(dim=-1, descending=True).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min() / top.abs().max()))

    for layer in model.model.layers:
        if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts"):
            handles.append(layer.mlp.gate.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    finally:
        for handle in handles:
            handle.remove()
    assert gaps, "no sparse layer"
    return min(gaps)


def _draw(model, draw, tries=20):
    """Inputs from ``draw(generator)`` whose routing has no near tie (redrawn until it has none)."""
    for seed in range(tries):
        ids, mask, *rest = draw(torch.Generator().manual_seed(seed))
        if _routing_gap(model, ids, mask) >= GAP:
            return (ids, mask, *rest)
    raise AssertionError(f"no inputs without a near tie in the routing after {tries} draws")


@pytest.fixture(params=["untied", "tied"])
def saved(request, tmp_path):
    with in_float64():
        torch.manual_seed(0)
        model = _model(tie=request.param == "tied")
        model.save_pretrained(tmp_path)
        params, config = load_pretrained(tmp_path)
        yield model, params, config


def test_the_small_model_has_what_the_real_one_has(saved):
    model, params, config = saved
    assert config.setting("sparse_layers") == (False, True, True) and config.setting("moe_d_ff") == 12
    assert (config.num_experts, config.experts_per_token, config.d_head) == (4, 2, 6)
    assert params["layers.0.mlp.W_gate"].shape == (16, 24) and "layers.0.mlp.W_router" not in params
    assert params["layers.1.mlp.experts.W_gate"].shape == (4, 16, 12) and "layers.1.mlp.W_gate" not in params
    assert [hasattr(layer.mlp, "experts") for layer in model.model.layers] == [False, True, True]


def test_logits_loss_and_every_gradient(saved):
    model, params, config = saved
    V = config.vocab_size

    def draw(g):
        ids = torch.randint(1, V, (2, 9), generator=g)
        ids[0, 4] = 0  # the pad token inside a sequence: its row is read, and gets no gradient
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0  # right padding in the second row
        return ids, mask

    with in_float64():
        ids, mask = _draw(model, draw)
        labels = ids.masked_fill(mask == 0, -100)
        out = model(ids, attention_mask=mask, labels=labels)
        loss_64 = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
        loss_64.backward()

    loss, grads, logits = ar.lm_loss(ids.numpy(), params, config, attention_mask=mask.numpy())
    real = mask.numpy().astype(bool)
    _close(logits[real], out.logits[mask.bool()], "logits")
    assert abs(loss - loss_64.item()) <= RTOL * abs(loss_64.item()), (loss, loss_64.item())
    assert abs(loss - out.loss.item()) <= 1e-6 * abs(loss)  # labels=: computed in float32 by transformers
    theirs = to_transformers(grads, config)
    named = dict(model.named_parameters(remove_duplicate=False))
    assert sorted(theirs) == sorted(named) == sorted(model.state_dict())  # router, experts, a tied head
    for name, p in named.items():
        assert p.grad is not None, name
        if ".experts." in name and float(p.grad.abs().max()) == 0:  # an expert no token chose: no gradient
            assert not np.any(theirs[name]), name
            continue
        assert float(p.grad.abs().max()) > 0, name  # every other weight reached
        _close(theirs[name], p.grad, f"d {name}")


def test_to_transformers_gives_their_weights(saved):
    model, params, config = saved
    theirs = to_transformers(params, config)
    for name, p in model.state_dict().items():
        np.testing.assert_array_equal(theirs[name], p.numpy(), err_msg=name)


def test_generate_left_padded_batch_token_for_token(saved):
    model, params, config = saved

    def draw(g):
        ids = torch.randint(1, config.vocab_size, (3, 6), generator=g)
        mask = torch.ones_like(ids)
        mask[1, :2] = 0
        mask[2, :4] = 0
        ids = ids.masked_fill(mask == 0, 0)
        with torch.no_grad():
            full = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
        return full, torch.cat([mask, torch.ones(3, 8, dtype=mask.dtype)], dim=1), ids, mask

    with in_float64():  # the gap checked over the prompt and every generated token
        full, _, ids, mask = _draw(model, draw)
    ours = ar.generate(ids.numpy(), params, config, 8, attention_mask=mask.numpy())
    np.testing.assert_array_equal(ours, full.numpy())


def test_each_decoding_step_against_past_key_values(saved):
    """Our decoder's logits at every step against transformers' model run step by step on its own
    cache, in float64, a left-padded batch."""
    model, params, config = saved

    def draw(g):
        ids = torch.randint(1, config.vocab_size, (2, 5), generator=g)
        mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
        steps = torch.randint(1, config.vocab_size, (2, 4), generator=g)
        return (torch.cat([ids.masked_fill(mask == 0, 0), steps], 1),
                torch.cat([mask, torch.ones(2, 4, dtype=mask.dtype)], 1))

    with in_float64():
        full, full_mask = _draw(model, draw)
        ids, mask, steps = full[:, :5], full_mask[:, :5], full[:, 5:]
        decoder = ar.LMDecoder(params, config)
        ours = [decoder.prefill(ids.numpy(), mask.numpy())[:, -1]]
        ours += [decoder.step(steps[:, i].numpy()) for i in range(4)]
        with torch.no_grad():
            positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
            res = model(ids, attention_mask=mask, position_ids=positions, **with_cache(model, None))
            theirs, past = [res.logits[:, -1]], returned_cache(res)
            for i in range(4):
                mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], dim=1)
                positions = positions[:, -1:] + 1
                res = model(steps[:, i:i + 1], attention_mask=mask, position_ids=positions, **with_cache(model, past))
                theirs.append(res.logits[:, -1])
                past = returned_cache(res)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        _close(a, b, f"logits of step {i}")


LINEAR = {"rope_type": "linear", "factor": 2.0}


def test_plain_top_k_a_sparse_step_and_scaled_rope(tmp_path):
    """``norm_topk_prob`` False (the softmax's top k as they are) and ``decoder_sparse_step`` 2 with no
    ``mlp_only_layers`` (layers 1 and 3 sparse, 0 and 2 dense); RoPE scaled (linear, factor 2), as Qwen3 reads it."""
    rope = ({"rope_parameters": {**LINEAR, "rope_theta": 500.0}} if FIVE
            else {"rope_theta": 500.0, "rope_scaling": LINEAR})
    with in_float64():
        torch.manual_seed(4)
        model = _model(norm_topk_prob=False, mlp_only_layers=None, decoder_sparse_step=2, num_hidden_layers=4, **rope)
        model.save_pretrained(tmp_path)
        params, config = load_pretrained(tmp_path)
        assert config.setting("sparse_layers") == (False, True, False, True)
        assert config.setting("norm_topk_prob") is False and dict(config.rope_scaling) == LINEAR

        def draw(g):
            ids = torch.randint(1, config.vocab_size, (2, 8), generator=g)
            return ids, torch.ones_like(ids)

        ids, mask = _draw(model, draw)
        with torch.no_grad():
            theirs = model(ids).logits
    logits, _ = ar.lm_forward(ids.numpy(), params, config)
    _close(logits, theirs, "logits")


def test_a_sliding_window_on_every_layer(tmp_path):
    """``use_sliding_window`` with a window of 3 keys, shorter than the prompts: the logits of a left-padded
    batch, and ``generate`` token for token (decoding: the window over the cache)."""
    with in_float64():
        torch.manual_seed(5)
        model = _model(use_sliding_window=True, sliding_window=3)
        model.save_pretrained(tmp_path)
        params, config = load_pretrained(tmp_path)
        assert config.sliding_window == 3

        def draw(g):
            ids = torch.randint(1, config.vocab_size, (2, 8), generator=g)
            mask = torch.ones_like(ids)
            mask[1, :2] = 0
            ids = ids.masked_fill(mask == 0, 0)
            with torch.no_grad():
                full = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
            return ids, mask, full

        ids, mask, full = _draw(model, draw)
        with torch.no_grad():
            theirs = model(ids, attention_mask=mask).logits
    logits, _ = ar.lm_forward(ids.numpy(), params, config, attention_mask=mask.numpy())
    real = mask.numpy().astype(bool)
    _close(logits[real], theirs[mask.bool()], "logits")
    np.testing.assert_array_equal(ar.generate(ids.numpy(), params, config, 6, attention_mask=mask.numpy()), full.numpy())
    without = ar.LMConfig.from_dict({**ar.models.families.FAMILY["qwen3_moe"].example, "model_type": "qwen3_moe",
                                     "sliding_window": 3})
    assert without.sliding_window is None  # the window is read only when use_sliding_window is true


@pytest.mark.parametrize("field, value, match", [
    ("use_sliding_window", "yes", "field 'use_sliding_window' must be a JSON boolean"),
    ("attention_bias", True, "attention_bias = True is not supported"),
    ("hidden_act", "gelu", "hidden_act = 'gelu' is not supported"),
    ("num_local_experts", 8, "num_experts = 4 and num_local_experts = 8"),
    ("mlp_only_layers", [0.5], "mlp_only_layers must be a list of layer indices"),
    ("shared_expert_intermediate_size", 8, "config.json key 'shared_expert_intermediate_size'"),
    ("decoder_sparse_step", None, "decoder_sparse_step must be a positive integer"),  # was a TypeError of %
    ("num_experts", None, "num_experts is null"),  # was read as the default 128
    ("head_dim", None, "head_dim is null"),  # was hidden / heads; transformers reads None and cannot build it
])
def test_fields_that_change_the_numbers_are_refused_by_name(field, value, match):
    from attention_ref.models.families import FAMILY

    d = dict(FAMILY["qwen3_moe"].example, model_type="qwen3_moe")
    d[field] = value
    with pytest.raises(ValueError, match=match):
        ar.LMConfig.from_dict(d)


def test_both_spellings_of_the_experts_count_are_read():
    from attention_ref.models.families import FAMILY

    d = dict(FAMILY["qwen3_moe"].example, model_type="qwen3_moe")
    five = {**{k: v for k, v in d.items() if k != "num_experts"}, "num_local_experts": 4}
    assert ar.LMConfig.from_dict(five) == ar.LMConfig.from_dict(d)
    assert ar.LMConfig.from_dict({**d, "num_local_experts": 4}).num_experts == 4
