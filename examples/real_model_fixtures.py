"""Reference outputs and gradients of a GPT-2 and a Llama layer, from transformers itself.

Builds ``GPT2Model`` and ``LlamaModel`` (one layer each, grouped-query heads for Llama) from
small configs with random weights (seeded; no download), in float64, runs a random input
forward and a random upstream gradient backward, and stores the weights, the input, the
output and every gradient in ``notebooks/data/{gpt2,llama}_layer.npz``. Notebook 16 checks
ours against them without needing torch; ``tests/interop/test_against_transformers.py``
regenerates them (where torch is installed) and checks the committed files still match.

Needs ``pip install torch==2.13.0 transformers==4.57.1``. Prints a summary; writes the files
only with ``--write``.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "notebooks" / "data"


def build(name):
    """(arrays to store, a one-line summary) for ``"gpt2"`` or ``"llama"``."""
    import torch
    import transformers

    from attention_ref.interop import llama_in_float64  # transformers' float32 steps, in float64

    torch.manual_seed(0)
    in_float64 = contextlib.nullcontext() if name == "gpt2" else llama_in_float64()
    if name == "gpt2":
        config = transformers.GPT2Config(n_embd=16, n_head=4, n_layer=1, n_positions=32, vocab_size=32, resid_pdrop=0.0,
                                         embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager")
        model = transformers.GPT2Model(config).double().eval()
        noise = lambda n: n.endswith("bias") or "ln" in n  # noqa: E731
    else:
        config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_attention_heads=4,
                                          num_key_value_heads=2, num_hidden_layers=1, rms_norm_eps=1e-6,
                                          rope_theta=100.0, max_position_embeddings=64, vocab_size=32,
                                          attn_implementation="sdpa")
        model = transformers.LlamaModel(config).double().eval()
        noise = lambda n: "norm" in n  # noqa: E731
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p)) if noise(n) else p.mul_(1.0 if name == "gpt2" else 10.0)
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    with in_float64:
        out = model(inputs_embeds=x).last_hidden_state
        dout = torch.randn_like(out)
        (out * dout).sum().backward()
    arrays = {f"state/{k}": v.detach().numpy() for k, v in model.state_dict().items()}
    arrays.update({f"grad/{k}": p.grad.numpy() for k, p in model.named_parameters() if p.grad is not None})
    arrays.update({"input": x.detach().numpy(), "output": out.detach().numpy(), "dout": dout.numpy(),
                   "dinput": x.grad.numpy()})
    summary = (f"{name}: transformers {transformers.__version__}, torch {torch.__version__}, "
               f"{sum(k.startswith('state/') for k in arrays)} tensors, output {tuple(out.shape)}")
    return arrays, summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write the .npz files into {OUT}")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("needs torch and transformers: pip install torch==2.13.0 transformers==4.57.1", file=sys.stderr)
        return 2
    for name in ("gpt2", "llama"):
        arrays, summary = build(name)
        print(summary)
        if args.write:
            OUT.mkdir(parents=True, exist_ok=True)
            from attention_ref._atomic import atomic_path

            with atomic_path(OUT / f"{name}_layer.npz") as tmp:  # keeps the .npz suffix
                np.savez_compressed(tmp, **arrays)
            print(f"wrote {OUT / f'{name}_layer.npz'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
