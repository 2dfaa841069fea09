"""The checks the mixture-of-experts families' whole-model tests share (gpt-oss, Qwen3-MoE, Qwen3-Next and
DeepSeek-V3 against transformers' ``*ForCausalLM``), written once: inputs drawn far from a tie in the routing,
the comparison at 1e-10 relative, and the checks whose steps are the same for every such family (the logits and
the loss with transformers' gradients, ``to_transformers`` of the weights, greedy ``generate`` on a left-padded
batch token for token, each decoding step against transformers' own cache, a full batch's logits).

A test file passes its family's difference in one :class:`MoEChecks`: its float64 patch (transformers' float32
steps run as the same formulas in float64, a context manager), its router module's name (``mlp.router`` or
``mlp.gate``) and the margins its routing must keep; its model, params and config come with each call.

Why the inputs are drawn: the choice of experts is discrete, so a near tie between a token's k-th and (k+1)-th
choice could be broken one way here and the other way there by a rounding at 1e-15. Inputs are drawn from seeds
0, 1, ... until every real token's margins, in every layer with experts, are at least ``GAP`` (hooks on
transformers' routers read their inputs).

The test files import this after their ``pytest.importorskip("torch")``: without torch they skip before it.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np
import torch

import attention_ref as ar
from attention_ref.interop import load_pretrained, to_transformers
from _transformers_api import decode_side_by_side

#: every comparison with transformers' float64 model: relative to the largest entry of theirs
RTOL = 1e-10
#: the smallest margin of the routing the drawn inputs keep (relative to the logits' scale for a top-k margin)
GAP = 1e-6


def close(ours, theirs, what, rtol=RTOL):
    """Assert ``ours`` is within ``rtol`` of the largest entry of ``theirs`` (a tensor or an array)."""
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else np.asarray(theirs)
    scale = max(float(np.abs(theirs).max()), 1e-300)
    err = float(np.abs(np.asarray(ours) - theirs).max())
    assert err <= rtol * scale, f"{what}: max abs error {err:.2e} against max |value| {scale:.2e}"


def weights_written_back(model, params, config):
    """``to_transformers`` of our params gives every tensor of the model's ``state_dict``, equal."""
    theirs = to_transformers(params, config)
    for name, p in model.state_dict().items():
        np.testing.assert_array_equal(theirs[name], p.numpy(), err_msg=name)


def top_k_margin(router, x, config):
    """The smallest gap between a token's k-th and (k+1)-th router logit, relative to the largest logit (the
    softmax routings: gpt-oss's, Qwen3-MoE's, Qwen3-Next's); ``x`` (T, D) the router's input at the real tokens."""
    k = config.num_experts_per_tok
    logits = torch.nn.functional.linear(x, router.weight, getattr(router, "bias", None))  # (T, E)
    top = logits.sort(dim=-1, descending=True).values
    return [float((top[:, k - 1] - top[:, k]).min() / top.abs().max())]


def pad_inside_and_right(vocab_size):
    """A draw of two rows of 9 tokens: the pad token (0) inside the first (its row is read, and gets no gradient),
    the second right-padded after 6."""
    def draw(g):
        ids = torch.randint(1, vocab_size, (2, 9), generator=g)
        ids[0, 4] = 0
        mask = torch.ones_like(ids)
        mask[1, 6:] = 0
        return ids, mask
    return draw


class MoEChecks(NamedTuple):
    """One family's difference in the shared checks (see the module docstring)."""

    in_float64: Callable  # () -> a context manager: transformers' float32 steps run in float64
    router: str = "gate"  # the router's module in each layer with experts: mlp.<router>
    margins: Callable = top_k_margin  # (router module, x (T, D) at the real tokens, config) -> [margin, ...]
    tries: int = 20  # seeds drawn before giving up

    def saved(self, make, folder, seed=0):
        """A fixture's body: transformers' model ``make()`` (built under the float64 patch after
        ``torch.manual_seed(seed)``), written by ``save_pretrained`` into ``folder`` and read by our
        ``load_pretrained``; yields ``(model, params, config)`` with the patch still on."""
        with self.in_float64():
            torch.manual_seed(seed)
            model = make()
            model.save_pretrained(folder)
            params, config = load_pretrained(folder)
            yield model, params, config

    def routing_gap(self, model, ids, mask):
        """The smallest margin over every layer with experts (forward hooks on each ``mlp.<router>``)."""
        keep = torch.as_tensor(mask).reshape(-1).bool()
        gaps, handles = [], []

        def hook(router, args, output):
            gaps.extend(self.margins(router, args[0].reshape(-1, router.weight.shape[1])[keep], model.config))

        for layer in model.model.layers:
            if hasattr(layer.mlp, "experts"):
                handles.append(getattr(layer.mlp, self.router).register_forward_hook(hook))
        try:
            with torch.no_grad():
                model(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
        finally:
            for handle in handles:
                handle.remove()
        assert gaps, "no layer with experts"
        return min(gaps)

    def draw(self, model, draw):
        """Inputs ``(ids, mask, ...)`` from ``draw(generator)`` whose routing has no near tie (drawn again until
        it has none)."""
        for seed in range(self.tries):
            ids, mask, *rest = draw(torch.Generator().manual_seed(seed))
            if self.routing_gap(model, ids, mask) >= GAP:
                return (ids, mask, *rest)
        raise AssertionError(f"no inputs without a near tie in the routing after {self.tries} draws")

    def loss_and_gradients(self, model, params, config, draw, labels=True):
        """transformers' float64 logits and shifted cross-entropy on inputs from ``draw`` (no near tie), and its
        ``backward``; ours by ``lm_loss``: the real positions' logits and the loss at 1e-10 relative, and, with
        ``labels``, the loss transformers computes for ``labels=`` (``logits.float()``: 1e-6). Returns our
        gradients under transformers' names and the model's named parameters (their ``grad`` set)."""
        V = config.vocab_size
        with self.in_float64():
            ids, mask = self.draw(model, draw)
            targets = ids.masked_fill(mask == 0, -100)
            out = model(ids, attention_mask=mask, **({"labels": targets} if labels else {}))
            loss_64 = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, V), targets[:, 1:].reshape(-1))
            loss_64.backward()
        loss, grads, logits = ar.lm_loss(ids.numpy(), params, config, attention_mask=mask.numpy())
        real = mask.numpy().astype(bool)
        close(logits[real], out.logits[mask.bool()], "logits")
        assert abs(loss - loss_64.item()) <= RTOL * abs(loss_64.item()), (loss, loss_64.item())
        if labels:
            assert abs(loss - out.loss.item()) <= 1e-6 * abs(loss)  # labels=: computed in float32 by transformers
        return to_transformers(grads, config), dict(model.named_parameters(remove_duplicate=False))

    def generate_left_padded(self, model, params, config, new_tokens=8):
        """Greedy ``generate`` of three prompts of 6 tokens, left-padded by 0, 2 and 4, token for token against
        ``model.generate(do_sample=False)`` (the routing's gap checked over the prompt and every generated token)."""
        def draw(g):
            ids = torch.randint(1, config.vocab_size, (3, 6), generator=g)
            mask = torch.ones_like(ids)
            mask[1, :2] = 0
            mask[2, :4] = 0
            ids = ids.masked_fill(mask == 0, 0)
            with torch.no_grad():
                full = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                      pad_token_id=0)
            return full, torch.cat([mask, torch.ones(3, new_tokens, dtype=mask.dtype)], dim=1), ids, mask

        with self.in_float64():
            full, _, ids, mask = self.draw(model, draw)
        ours = ar.generate(ids.numpy(), params, config, new_tokens, attention_mask=mask.numpy())
        np.testing.assert_array_equal(ours, full.numpy())

    def decoding_steps(self, model, params, config):
        """Our decoder's logits at the prefill of two prompts of 5 (the first left-padded by 2) and at each of 4
        steps, against transformers' model run step by step on its own cache, in float64. Returns our decoder."""
        def draw(g):
            ids = torch.randint(1, config.vocab_size, (2, 5), generator=g)
            mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
            steps = torch.randint(1, config.vocab_size, (2, 4), generator=g)
            return (torch.cat([ids.masked_fill(mask == 0, 0), steps], 1),
                    torch.cat([mask, torch.ones(2, 4, dtype=mask.dtype)], 1))

        with self.in_float64():
            full, full_mask = self.draw(model, draw)
            ids, mask, steps = full[:, :5], full_mask[:, :5], full[:, 5:]
            decoder = ar.LMDecoder(params, config)
            ours, theirs = decode_side_by_side(model, decoder, ids, mask, steps)
        for i, (a, b) in enumerate(zip(ours, theirs)):
            close(a, b, f"logits of step {i}")
        return decoder

    def full_batch_logits(self, model, params, config):
        """Two rows of 8 tokens, no padding: our ``lm_forward``'s logits against the model's. Called inside the
        test's float64 patch (the model was built under it)."""
        def draw(g):
            ids = torch.randint(1, config.vocab_size, (2, 8), generator=g)
            return ids, torch.ones_like(ids)

        ids, mask = self.draw(model, draw)
        with torch.no_grad():
            theirs = model(ids).logits
        logits, _ = ar.lm_forward(ids.numpy(), params, config)
        close(logits, theirs, "logits")
