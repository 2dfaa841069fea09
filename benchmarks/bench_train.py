"""Training-step speed of the whole models: attention_ref's ``lm_loss`` (``lm_forward``,
cross-entropy and ``lm_backward``) against torch autograd's forward + backward of the same
transformers model.

Run from the repository root::

    python benchmarks/bench_train.py              # SmolLM-135M's sizes at T = 256 and every family small
    python benchmarks/bench_train.py --quick      # a tiny Llama, one thread, one repeat: checks that it runs
    python benchmarks/bench_train.py --threads 1 --family gpt_neox   # one thread count, the rows of a family
    python benchmarks/bench_train.py --no-torch   # attention_ref only
    python benchmarks/bench_train.py --rounds 5   # on a loaded machine: the ratio pair by pair, 5 pairs
    python benchmarks/bench_train.py --env MALLOC_TRIM_THRESHOLD_=1073741824   # both libraries with it set
    python benchmarks/bench_train.py --drop-results      # ours dropping each step's result at once

What is timed, per row and thread count: one training step on one sequence of ``T`` random token
ids, float32, the next-token loss of transformers' ``model(ids, labels=ids)``:

* ours: ``attention_ref.lm_loss(ids, params, config)`` (``lm_forward``, ``cross_entropy_forward``
  and ``_backward``, ``lm_backward``: the loss and every gradient), its result kept until the next
  step has returned, as a training loop keeps it (``loss, grads, logits = lm_loss(...)``, then the
  update reads ``grads``);
* torch: ``model(ids, labels=ids).loss.backward()`` on ``AutoModelForCausalLM.from_config`` of the
  same config, with our random weights loaded (``to_transformers``), gradients set to None at the
  start of each step (``zero_grad(set_to_none=True)``, where torch's usual loop calls it, before the
  forward), in eval mode (no dropout, which the package does not have; autograd is the same).

So the two hold different things while a step runs, each as its own usual loop does: our previous
step's gradients and logits are alive during our next step (freed when it returns), torch's previous
gradients are not (freed as the step starts). Both frees are inside the timed step.
``--drop-results`` times ours with nothing of the previous step alive.

Rows: SmolLM-135M's sizes (a Llama: 30 layers, 576 wide, 9 query heads, 3 key/value heads, vocabulary
49152) at T = 256, and every family of ``attention_ref.models.families`` at small sizes: its
``Family.example`` config with the width 256 (heads kept, so 64 wide when it has 4), the hidden
width 1024, 64-wide heads where the config names a head width, a vocabulary of 8192, T = 128
(the example's layer count and every other field kept). Each library runs in its own fresh
process per row and thread count (``OMP_NUM_THREADS`` and friends set before NumPy or torch is
imported, ``torch.set_num_threads``), one warm-up step, then the best of ``--repeats``; with
``--rounds N`` that N times, the two libraries back to back in each round (their order swapped every
round), each library's median round kept and the ratio ours / torch taken pair by pair (its median
and range: a loaded machine slows both processes of a pair alike, so the paired ratio moves much
less than the times). Both
report their loss; the script refuses a row whose losses differ by more than 1e-4 relative (the
same model, or the timing is of something else).

The share of the BLAS peak: the step's matrix-product FLOPs (each ``(m, k) @ (k, n)`` is ``2 m k n``;
forward + backward is 3 times the forward: ``6 T`` per weight of a matrix product, the head
included, plus ``12 T^2 H d_head`` per layer for the scores and the weighted values, the causal
half included as computed) over the time, divided by the float32 matrix-product peak measured in
the same process (a 1024 x 1024 square product, best of 5) at the same thread count. An
approximation: sliding windows, norms and elementwise work are not counted.

Page faults a step: the minor faults of the process over the timed steps, divided by their count. A
process whose memory rises and falls by tens of megabytes a step (the activations, the logits and
their temporaries) has glibc give the freed pages back to the system and take them again, a fault
per 4 KiB page (whether it does depends on what else is alive: docs/performance.md counts ours both
ways, kept and with ``--drop-results``: keeping the result took the Gemma rows' faults from
5,000-7,000 a step to about 900-1,100 and the others' from under 200 to about 750-1,200);
``--env MALLOC_TRIM_THRESHOLD_=1073741824 --env MALLOC_MMAP_THRESHOLD_=1073741824`` runs both
libraries with glibc keeping them (docs/performance.md measures what that changes).

Nothing is written unless ``--out`` is given (the table, through a temporary file renamed into place).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
#: SmolLM-135M's config.json (random weights: only the shapes matter)
SMOLLM = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30,
          "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
          "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "hidden_act": "silu"}
SMOLLM_T, SMALL_T, QUICK_T = 256, 128, 16
#: the fields of a family's example set for its small row (those it has)
SMALL_SIZES = {"n_embd": 256, "hidden_size": 256, "n_inner": 1024, "intermediate_size": 1024, "head_dim": 64,
               "query_pre_attn_scalar": 64, "vocab_size": 8192, "n_positions": 1024, "max_position_embeddings": 1024}
PEAK_N = 1024


def rows(quick: bool, families=None) -> dict:
    """{row name: (config dict, T)}: SmolLM-135M's sizes and every family small, or one tiny Llama."""
    from attention_ref.models.families import FAMILY

    if quick:
        return {"tiny Llama (the llama family's example)": ({**FAMILY["llama"].example, "model_type": "llama"},
                                                            QUICK_T)}
    out = {"SmolLM-135M's sizes": (SMOLLM, SMOLLM_T)}
    for name, family in FAMILY.items():
        example = {**family.example, "model_type": name}
        out[f"{name}, small"] = ({k: SMALL_SIZES.get(k, v) for k, v in example.items()}, SMALL_T)
    if families:
        out = {k: v for k, v in out.items() if v[0]["model_type"] in families}
    return out


def matmul_flops(params, config, T: int) -> float:
    """Matrix-product FLOPs of one forward + backward on T tokens (see the module's docstring)."""
    weights = 0
    for name, w in params.items():
        in_layer = any(part.isdigit() for part in name.split("."))
        lookup = not in_layer and w.ndim == 2 and not name.startswith("lm_head")
        if w.ndim == 2 and (not lookup or (config.tie_word_embeddings and w.shape[0] == config.vocab_size)):
            weights += w.size  # a matrix product's weight (a tied table is the head)
    head_dim = config.head_dim or config.d_model // config.num_heads
    attention = 12 * T * T * config.num_heads * head_dim * config.num_layers
    return 6.0 * T * weights + attention


def _peak(np) -> float:
    """FLOP/s of a float32 square product (best of 5)."""
    a = np.ones((PEAK_N, PEAK_N), dtype=np.float32)
    best = float("inf")
    for _ in range(6):  # the first is a warm-up
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2.0 * PEAK_N ** 3 / best


def worker(library: str, config_dict: dict, T: int, repeats: int, threads: int, keep: bool = True) -> dict:
    """One library's best step time in this process, its loss, the FLOPs and the BLAS peak; ``keep``
    False: ours drops each step's result at once (``--drop-results``)."""
    import numpy as np

    import attention_ref as ar

    config = ar.LMConfig.from_dict(config_dict)
    params = ar.init_lm_params(config, seed=0, dtype=np.float32)
    ids = np.random.default_rng(1).integers(0, config.vocab_size, (1, T))
    if library == "attention_ref":
        peak = _peak(np)

        held = {}

        def step():
            result = ar.lm_loss(ids, params, config)
            if keep:  # as a training loop runs it: the result (gradients, logits) is kept until the next step
                # has returned (the update reads the gradients); dropped at once (--drop-results), glibc may
                # give the step's memory back to the system and take it again every step
                held["last"] = result
            return result[0]
    else:
        import torch
        import transformers

        from attention_ref.interop import to_transformers

        torch.set_num_threads(threads)
        peak = _peak(np)  # NumPy's BLAS, for the same column; torch's own products are timed in the step
        torch_config = transformers.AutoConfig.for_model(**config_dict)
        if getattr(torch_config, "pad_token_id", None) is not None and torch_config.pad_token_id >= config.vocab_size:
            torch_config.pad_token_id = None  # a class default past the small vocabulary (Phi-3's 32000); no token pads
        model = transformers.AutoModelForCausalLM.from_config(torch_config)
        model = model.float().eval()  # autograd runs in eval mode too; train mode adds only dropout (GPT-2's 0.1)
        state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in to_transformers(params, config).items()}
        model.load_state_dict(state, strict=True)
        ids_t = torch.from_numpy(ids)

        def step():
            model.zero_grad(set_to_none=True)
            loss = model(ids_t, labels=ids_t).loss
            loss.backward()
            return float(loss.detach())
    loss = step()  # warm-up
    best = float("inf")
    faults = _minor_faults()
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    faults = None if faults is None else (_minor_faults() - faults) / repeats
    return {"seconds": best, "loss": float(loss), "flops": matmul_flops(params, config, T), "peak": peak,
            "faults": faults}


def _minor_faults():
    """This process's minor page faults so far (None where ``resource`` is missing: Windows). A page
    the C library gave back to the system and takes again is one fault, a few microseconds each on
    a virtual machine: a step's count says how much of its time goes to memory the process keeps
    returning and re-taking (``--env`` with glibc's ``MALLOC_TRIM_THRESHOLD_`` changes it)."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _spawn(library: str, config_dict: dict, T: int, repeats: int, threads: int, extra_env=None,
           drop_results: bool = False) -> dict:
    """:func:`worker` in a fresh process with ``threads`` threads and ``extra_env`` ({name: value})
    added to its environment."""
    env = {**os.environ, **(extra_env or {}), **{k: str(threads) for k in THREAD_VARIABLES}, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, __file__, "--worker", library, json.dumps(config_dict), str(T),
                           str(repeats), str(threads), *(["--drop-results"] if drop_results else [])],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"the {library} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


def measure(table: dict, threads: list, repeats: int, torch: bool, rounds: int = 1, extra_env=None,
            drop_results: bool = False) -> list:
    """A result per row and thread count: each library's seconds (the median of ``rounds`` rounds of
    fresh processes, the two libraries back to back in each round, their order swapped every
    round), loss, FLOPs, peak and page faults a step, and the ratio ours / torch taken pair by pair
    (median, min, max); ``extra_env`` ({name: value}) is in both libraries' environments;
    ``drop_results``: our worker drops each step's result at once."""
    libraries = ["attention_ref"] + (["torch"] if torch else [])
    results = []
    for name, (config_dict, T) in table.items():
        for n in threads:
            runs = {library: [] for library in libraries}
            for r in range(rounds):
                for library in (libraries if r % 2 == 0 else libraries[::-1]):
                    print(f"{name}, {n} thread(s), round {r + 1} of {rounds}: {library}", file=sys.stderr,
                          flush=True)  # progress
                    runs[library].append(_spawn(library, config_dict, T, repeats, n, extra_env, drop_results))
            got = {library: _median_run(runs[library]) for library in libraries}
            if torch and abs(got["attention_ref"]["loss"] - got["torch"]["loss"]) > 1e-4 * abs(got["torch"]["loss"]):
                raise RuntimeError(f"{name}: the losses differ: ours {got['attention_ref']['loss']!r},"
                                   f" torch's {got['torch']['loss']!r}")
            result = {"model": name, "T": T, "threads": n, **got}
            if torch:
                ratios = [a["seconds"] / b["seconds"] for a, b in zip(runs["attention_ref"], runs["torch"])]
                result["ratio"] = (statistics.median(ratios), min(ratios), max(ratios))
            results.append(result)
            print("  " + ", ".join(f"{lib} {r['seconds']:.3f} s" for lib, r in got.items()), file=sys.stderr, flush=True)
    return results


def _median_run(runs: list) -> dict:
    """The run of median time (the lower middle one for an even count), with its loss, FLOPs and peak."""
    return sorted(runs, key=lambda run: run["seconds"])[(len(runs) - 1) // 2]


def render(results: list, repeats: int, command: str, rounds: int = 1) -> str:
    """The markdown table, with the date, the machine and the command."""
    import numpy as np

    versions = f"NumPy {np.__version__}"
    if any("torch" in r for r in results):  # their versions as installed (torch itself ran in its own processes)
        from importlib.metadata import PackageNotFoundError, version

        def installed(name):
            try:
                return version(name)
            except PackageNotFoundError:
                return "not installed"

        versions += f", torch {installed('torch')}, transformers {installed('transformers')}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ""
    try:
        load = f" Load average (1 minute) at the end of the run: {os.getloadavg()[0]:.1f}."
    except (AttributeError, OSError):
        pass
    pairs = ("" if rounds == 1 else f"; the median of {rounds} rounds, the two libraries back to back in each (their"
             " order swapped every round), the ratio taken pair by pair: its median (and range over the rounds)")
    lines = [f"Measured {datetime.date.today().isoformat()} on {cpu}, {versions}, float32, one sequence, best of"
             f" {repeats} steps after a warm-up, each library in its own process{pairs}: `{command}`.{load}", "",
             "| model | T | threads | ours s/step | torch s/step | ours / torch | ours % of BLAS peak"
             " | torch % of BLAS peak | ours page faults/step | torch page faults/step |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        ours, theirs = r["attention_ref"], r.get("torch")

        def share(x):
            return f"{100 * x['flops'] / x['seconds'] / x['peak']:.0f}"

        their_s = "-" if theirs is None else f"{theirs['seconds']:.3f}"
        ratio = "-" if theirs is None else f"{r['ratio'][0]:.2f}"
        if theirs is not None and rounds > 1:
            ratio += f" ({r['ratio'][1]:.2f}-{r['ratio'][2]:.2f})"
        def faults(x):
            return "-" if x is None or x.get("faults") is None else f"{x['faults']:.0f}"

        lines.append(f"| {r['model']} | {r['T']} | {r['threads']} | {ours['seconds']:.3f} | {their_s} | {ratio} |"
                     f" {share(ours)} | {'-' if theirs is None else share(theirs)} | {faults(ours)} | {faults(theirs)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny Llama, one thread, one repeat")
    parser.add_argument("--threads", type=int, action="append", default=[], help="thread counts (default: 1 and 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per process (best kept)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of fresh processes, the two libraries back to back (ratio pair by pair)")
    parser.add_argument("--family", action="append", default=[], help="only the rows of these model_types")
    parser.add_argument("--no-torch", action="store_true", help="time attention_ref only")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in both libraries' processes (e.g. MALLOC_TRIM_THRESHOLD_=1073741824)")
    parser.add_argument("--drop-results", action="store_true",
                        help="ours drops each step's result at once (a training loop keeps it until the next step)")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        library, config, T, repeats, threads = args.worker
        print(json.dumps(worker(library, json.loads(config), int(T), int(repeats), int(threads),
                                keep=not args.drop_results)))
        return 0
    if args.repeats < 1 or args.rounds < 1 or any(n < 1 for n in args.threads):
        parser.error("--repeats, --rounds and --threads must be at least 1")
    bad = [e for e in args.env if "=" not in e or not e.split("=", 1)[0]]
    if bad:
        parser.error(f"--env {bad[0]!r}: give NAME=VALUE")
    extra_env = dict(e.split("=", 1) for e in args.env)
    if set(extra_env) & set(THREAD_VARIABLES):
        parser.error(f"--env {sorted(set(extra_env) & set(THREAD_VARIABLES))[0]}: the thread counts come from --threads")
    if "PYTHONPATH" in extra_env:
        parser.error("--env PYTHONPATH: the workers import this clone's attention_ref (PYTHONPATH is its root)")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # run as a script from a clone that is not installed
    table = rows(args.quick, args.family)
    if not table:
        parser.error(f"--family {args.family}: no row of these model_types")
    threads = args.threads or ([1] if args.quick else [1, 2])
    repeats = 1 if args.quick else args.repeats
    rounds = 1 if args.quick else args.rounds
    results = measure(table, threads, repeats, _has_torch() and not args.no_torch, rounds, extra_env, args.drop_results)
    command = "python benchmarks/bench_train.py" + " ".join([""] + (argv if argv is not None else sys.argv[1:]))
    text = render(results, repeats, command.replace(f" --out {args.out}", "") if args.out else command, rounds)
    print(text, end="")
    if args.out:
        from attention_ref._atomic import write_atomic  # the package's one atomic writer

        write_atomic(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
