"""Train a tiny byte-level GPT from scratch with the hand-derived gradients and Adam.

    python examples/train_tiny_gpt.py                # about 3 minutes on 2 cores; prints only
    python examples/train_tiny_gpt.py --write        # also rewrites docs/train_tiny_gpt.json,
                                                     # docs/figures/train_tiny_gpt.png and the
                                                     # generated block of docs/whole_models.md
    python examples/train_tiny_gpt.py --steps 200    # a shorter run
    python examples/train_tiny_gpt.py --save-model DIR   # also keeps the weights in DIR

``--write`` also keeps the trained weights in ``notebooks/data/tiny_gpt/`` (``MODEL``), a folder
as transformers' ``save_pretrained`` writes it: ``config.json`` (GPT-2's fields) and
``model.safetensors`` (float32, transformers' tensor names), which
``attention_ref.interop.load_pretrained`` and transformers' ``GPT2LMHeadModel.from_pretrained``
both read; beside them ``held_out.txt`` (the held-out text, byte for byte), ``training.json``
(the command, Python and NumPy versions, date, the training text's modules and SHA-256, the
held-out windows and the held-out loss of the saved float32 weights) and a ``README.md``
rendered from it. ``--save-model DIR`` writes the same folder elsewhere (DIR is created if
needed; nothing else in it is touched).

The text is real and on every machine without a download: the source of ten modules of
Python's own standard library (``CORPUS``), read as bytes (a vocabulary of 256), the last
10% of it held out. The model is GPT-2's (``attention_ref.gpt2_lm_forward``): learned token
and position embeddings, 2 blocks of causal self-attention with 4 heads, width 64, contexts
of 64 bytes. Each step draws 16 random windows, computes the next-byte loss and every
gradient with ``attention_ref.lm_loss`` (hand-derived backward passes only) and takes one
Adam step. The held-out loss is measured on 64 fixed windows every ``--eval-every`` steps.
The standard library differs a little between Python versions, so the numbers do too
(the committed run says which Python it used).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's package

import attention_ref as ar  # noqa: E402
from attention_ref._atomic import atomic_path, write_atomic  # noqa: E402

#: The standard library modules whose source is the text (in this order).
CORPUS = ("argparse", "textwrap", "calendar", "difflib", "pprint", "shlex", "fractions", "heapq", "bisect",
          "functools")
RESULTS = ROOT / "docs" / "train_tiny_gpt.json"
FIGURE = ROOT / "docs" / "figures" / "train_tiny_gpt.png"
DOC = ROOT / "docs" / "whole_models.md"
MODEL = ROOT / "notebooks" / "data" / "tiny_gpt"  # the kept weights (--write)
_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_BLOCK = re.compile(r"(<!-- begin generated: train_tiny_gpt -->\n)(.*?)(<!-- end generated: train_tiny_gpt -->)", re.S)

CONFIG = ar.LMConfig(family="gpt2", vocab_size=256, d_model=64, num_layers=2, num_heads=4, num_kv_heads=4, d_ff=256,
                     max_positions=64, eps=1e-5)


def corpus() -> bytes:
    """The text: the modules of CORPUS, read from this Python's standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return b"".join((stdlib / f"{name}.py").read_bytes() for name in CORPUS)


def split(data: bytes, held_out=0.1):
    ids = np.frombuffer(data, np.uint8).astype(np.int64)
    cut = int(len(ids) * (1 - held_out))
    return ids[:cut], ids[cut:]


def windows(ids, starts, length):
    return np.stack([ids[s:s + length] for s in starts])  # (B, length)


def held_out_starts(val):
    """The 64 fixed held-out windows' first positions."""
    return np.random.default_rng(12345).integers(0, len(val) - CONFIG.max_positions, 64)


def held_out_loss(params, val, starts, config=CONFIG):
    """Mean next-byte loss (nats) over the windows of ``val`` that begin at ``starts``."""
    logits, _ = ar.lm_forward(windows(val, starts, config.max_positions), params, config)
    loss, _ = ar.cross_entropy_forward(logits, ar.next_token_targets(windows(val, starts, config.max_positions)))
    return float(loss)


def progress(step, steps, train, val, start):
    width = 30
    done = int(width * step / steps)
    sys.stderr.write(f"\rstep {step:>5}/{steps} [{'#' * done}{'.' * (width - done)}] train {train:.3f}"
                     f"  held-out {val:.3f}  {time.perf_counter() - start:5.0f} s")
    sys.stderr.flush()


def train(steps=3000, batch_size=16, lr=3e-3, eval_every=100, seed=0, show_progress=True):
    """Train; returns the record: losses, the final held-out loss, samples, time."""
    train_ids, val_ids = split(corpus())
    rng = np.random.default_rng(seed)
    T = CONFIG.max_positions
    val_starts = held_out_starts(val_ids)  # fixed held-out windows
    params = ar.init_lm_params(CONFIG, seed=seed)
    adam = ar.Adam(params, lr=lr)
    record = {"step": [], "train": [], "held_out": []}
    start, recent = time.perf_counter(), []
    for step in range(1, steps + 1):
        batch = windows(train_ids, rng.integers(0, len(train_ids) - T, batch_size), T)  # (B, T)
        loss, grads, _ = ar.lm_loss(batch, adam.params, CONFIG)
        adam.lr = lr * min(1.0, step / 100) * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * step / steps)))  # warm-up, cosine
        adam.step(grads)
        recent.append(loss)
        if step % eval_every == 0 or step == steps:
            record["step"].append(step)
            record["train"].append(float(np.mean(recent)))
            record["held_out"].append(held_out_loss(adam.params, val_ids, val_starts))
            recent = []
            if show_progress:
                progress(step, steps, record["train"][-1], record["held_out"][-1], start)
    if show_progress:
        sys.stderr.write("\n")
    seconds = time.perf_counter() - start
    prompts = [b"def ", b"class ", b"    if "]
    samples = []
    for i, prompt in enumerate(prompts):
        ids = np.frombuffer(prompt, np.uint8).astype(np.int64)
        out = ar.generate(ids, adam.params, CONFIG, T - len(ids), temperature=0.8, top_k=40, seed=i)  # to 64 bytes
        samples.append(bytes(out.astype(np.uint8)).decode("utf-8", errors="replace"))
    return {"params": adam.params,  # popped before the JSON is written; save_model keeps them
            "config": CONFIG.to_dict(), "corpus": list(CORPUS), "bytes": {"train": len(train_ids),
            "held_out": len(val_ids)}, "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
            "parameters": int(sum(v.size for v in params.values())), "curve": record, "final_held_out": record["held_out"][-1], "uniform": float(np.log(256)),
            "seconds": round(seconds, 1), "samples": samples, "python": platform.python_version(),
            "numpy": np.__version__, "date": time.strftime("%Y-%m-%d")}


def hf_config(config=CONFIG) -> dict:
    """config.json as transformers' GPT2Config writes it (the fields that matter to the maths, and no
    token ids: the vocabulary is the 256 bytes, with no special tokens)."""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config.vocab_size,
            "n_embd": config.d_model, "n_layer": config.num_layers, "n_head": config.num_heads,
            "n_inner": config.d_ff, "n_positions": config.max_positions, "n_ctx": config.max_positions,
            "layer_norm_epsilon": config.eps, "activation_function": "gelu_new", "tie_word_embeddings": True,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": None, "eos_token_id": None,
            "torch_dtype": "float32"}


def save_model(result, folder, command):
    """Keep the trained weights in ``folder`` (see the module's docstring); returns the metadata."""
    from attention_ref.interop import to_transformers, write_safetensors

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    params32 = {name: np.asarray(value, np.float32) for name, value in result["params"].items()}
    train_ids, val_ids = split(corpus())
    starts = held_out_starts(val_ids)
    kept = {name: value.astype(np.float64) for name, value in params32.items()}  # what a reader loads, in float64
    meta = {"command": command, "python": result["python"], "numpy": result["numpy"], "date": result["date"],
            "corpus": result["corpus"], "training_bytes": len(train_ids),
            "training_sha256": hashlib.sha256(bytes(train_ids.astype(np.uint8))).hexdigest(),
            "held_out_file": "held_out.txt", "held_out_bytes": len(val_ids),
            "held_out_sha256": hashlib.sha256(bytes(val_ids.astype(np.uint8))).hexdigest(),
            "held_out_starts": [int(s) for s in starts], "window": CONFIG.max_positions,
            "held_out_loss": held_out_loss(kept, val_ids, starts), "weights_dtype": "float32",
            "steps": result["steps"], "batch_size": result["batch_size"], "lr": result["lr"], "seed": result["seed"],
            "seconds": result["seconds"], "parameters": result["parameters"]}
    write_atomic(folder / "config.json", json.dumps(hf_config(), indent=1) + "\n")
    write_safetensors(to_transformers(params32, CONFIG), folder / "model.safetensors", metadata={"format": "pt"})
    write_atomic(folder / "held_out.txt", bytes(val_ids.astype(np.uint8)))
    write_atomic(folder / "training.json", json.dumps(meta, indent=1) + "\n")
    write_atomic(folder / "README.md", render_model_readme(meta))
    return meta


def render_model_readme(meta) -> str:
    """The kept model's README.md, from its training.json."""
    return "\n".join([
        "# A tiny byte-level GPT trained by attention_ref",
        "",
        f"GPT-2's architecture at {meta['parameters']:,} parameters (2 blocks, 4 heads, width 64, contexts of"
        f" {meta['window']} bytes, a vocabulary of the 256 bytes), trained from scratch by"
        " `examples/train_tiny_gpt.py` with the package's hand-derived gradients and Adam. Written by:",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"on {meta['date']} with Python {meta['python']} and NumPy {meta['numpy']}: {meta['steps']} steps of"
        f" {meta['batch_size']} windows, {meta['seconds']:.0f} s on 2 shared cores.",
        "",
        f"Training text: the source of the standard library modules {', '.join(meta['corpus'])} of that Python,"
        f" concatenated in this order, read as bytes; the first 90% ({meta['training_bytes']:,} bytes, SHA-256"
        f" `{meta['training_sha256']}`) trained it. The last 10% is kept here byte for byte as"
        f" `{meta['held_out_file']}` ({meta['held_out_bytes']:,} bytes): nothing of it was trained on.",
        "",
        f"Held-out loss of these (float32) weights, computed in float64 by `attention_ref` on the"
        f" {len(meta['held_out_starts'])} windows of {meta['window']} bytes of `held_out.txt` that begin at"
        f" `held_out_starts` in `training.json`: **{meta['held_out_loss']:.4f}** nats per byte (uniform over 256"
        " bytes: 5.5452). `tests/models/test_tiny_gpt_model.py` recomputes it from these files.",
        "",
        "Files: `config.json` and `model.safetensors` as transformers' `save_pretrained` writes them (read by"
        " `attention_ref.interop.load_pretrained` and by `transformers.GPT2LMHeadModel.from_pretrained`);"
        " `training.json`, this run's record; `held_out.txt`.",
        ""])


def render_block(result) -> str:
    """The generated block of docs/whole_models.md, from the JSON."""
    lines = [f"Run of {result['date']} (Python {result['python']}, NumPy {result['numpy']}): {result['steps']} steps"
             f" of {result['batch_size']} windows of {result['config']['max_positions']} bytes,"
             f" {result['parameters']:,} parameters,"
             f" {result['bytes']['train']:,} bytes of training text and {result['bytes']['held_out']:,} held out,"
             f" {result['seconds']:.0f} s. Final held-out loss **{result['final_held_out']:.3f}** nats per byte"
             f" (uniform over 256 bytes: {result['uniform']:.3f}).",
             "",
             "![Training and held-out loss of the tiny GPT](figures/train_tiny_gpt.png)",
             "",
             "The trained weights are kept in `notebooks/data/tiny_gpt/` (config.json and model.safetensors, as"
             " transformers' `save_pretrained` writes them, with the held-out text and the run's record); lessons 01"
             " and 04 open with its attention maps, and `tests/models/test_tiny_gpt_model.py` recomputes its held-out"
             " loss from those files.",
             "",
             "Samples (temperature 0.8, top 40), each from its prompt:",
             ""]
    for sample in result["samples"]:
        lines += ["```python", sample.rstrip(), "```", ""]
    return "\n".join(lines)


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    c = result["curve"]
    ax.plot(c["step"], c["train"], label="training (mean since the last point)")
    ax.plot(c["step"], c["held_out"], label="held out (64 fixed windows)")
    ax.axhline(result["uniform"], color="grey", linestyle=":", label="uniform over 256 bytes")
    ax.set_xlabel("Adam step")
    ax.set_ylabel("next-byte loss (nats)")
    ax.set_title("A tiny GPT on Python's standard library, hand-derived gradients")
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=_positive, default=3000)
    parser.add_argument("--eval-every", type=_positive, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true",
                        help="rewrite docs/train_tiny_gpt.json, its figure and the block of docs/whole_models.md")
    parser.add_argument("--render", action="store_true", help="rewrite the doc block from the committed JSON only")
    parser.add_argument("--save-model", metavar="DIR",
                        help="keep the trained weights in DIR (config.json, model.safetensors, held_out.txt, ...)")
    args = parser.parse_args(argv)
    if args.render and args.save_model:
        parser.error("--save-model needs a training run; --render only rewrites the doc block")
    threads = " ".join(f"{v}={os.environ[v]}" for v in _THREADS if v in os.environ)  # part of the command run
    command = (threads + " " if threads else "") + "python examples/train_tiny_gpt.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    if args.render:
        result = json.loads(RESULTS.read_text())
    else:
        result = train(args.steps, eval_every=args.eval_every, seed=args.seed)
        print(f"final held-out loss {result['final_held_out']:.3f} nats per byte after {result['steps']} steps"
              f" ({result['seconds']:.0f} s); uniform: {result['uniform']:.3f}")
        for sample in result["samples"]:
            print("---\n" + sample)
    for folder in ([MODEL] if args.write else []) + ([Path(args.save_model)] if args.save_model else []):
        meta = save_model(result, folder, command.strip())
        print(f"kept the weights in {folder}: held-out loss {meta['held_out_loss']:.4f} (float32 weights)")
    result.pop("params", None)
    if args.write:
        write_atomic(RESULTS, json.dumps(result, indent=1) + "\n")
        plot(result, FIGURE)
        print(f"wrote {RESULTS} and {FIGURE}")
    if args.write or args.render:
        text = DOC.read_text()
        if not _BLOCK.search(text):
            raise SystemExit(f"{DOC} has no generated block 'train_tiny_gpt'")
        write_atomic(DOC, _BLOCK.sub(lambda m: m.group(1) + render_block(result) + "\n" + m.group(3), text))
        print(f"wrote the generated block of {DOC}")
    return result


if __name__ == "__main__":
    main()
