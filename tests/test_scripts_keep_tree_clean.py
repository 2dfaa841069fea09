"""Nothing a reader runs dirties the tree: the scripts' cheap modes leave a checkout as they
found it, and the benchmarks refuse to write committed docs from their ``--quick`` sizes.

Each command runs in a throwaway copy of the working tree (the files git would list,
committed in a fresh repository there); afterwards ``git status --porcelain`` must be
empty. Nothing here is timed.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHEAP_RUNS = {  # a few seconds each
    "bench_mha --quick": ["benchmarks/bench_mha.py", "--quick", "--no-torch", "--repeats", "1"],
    "bench_mha --quick --case": ["benchmarks/bench_mha.py", "--quick", "--no-torch", "--repeats", "1",
                                 "--case", "float32:1:8", "--no-tricks"],
    "variants --quick": ["benchmarks/variants.py", "--quick", "--min-time", "0", "--max-repeats", "1"],
    "profile_mha --quick": ["benchmarks/profile_mha.py", "--quick"],
    "profile_decode --quick": ["benchmarks/profile_decode.py", "--quick", "--steps", "1", "--model", "tiny Llama"],
    "profile_decode --layouts --quick": ["benchmarks/profile_decode.py", "--layouts", "--quick"],
    "claims (print)": ["examples/claims.py"],
    "claims --check": ["examples/claims.py", "--check"],
    "make_training_docs (check)": ["examples/make_training_docs.py"],
}


def _git(cwd, *args) -> str:
    """Run git in ``cwd`` with a throwaway identity; its stdout."""
    command = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid",
               "-c", "commit.gpgsign=false", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the working tree (tracked and untracked, not ignored), committed in a new repository."""
    if shutil.which("git") is None:
        pytest.skip("git is not on PATH")
    try:
        names = _git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    except subprocess.CalledProcessError:
        pytest.skip(f"{ROOT} is not a git checkout")
    copy = tmp_path_factory.mktemp("checkout")
    for name in filter(None, names):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is skipped
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    _git(copy, "init", "-q")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-q", "-m", "snapshot")
    return copy


def _run_and_status(checkout, command):
    """Run ``python command`` in the copy; its process and the copy's git status, then undo any change."""
    proc = subprocess.run([sys.executable, *command], cwd=checkout, capture_output=True, text=True)
    status = _git(checkout, "status", "--porcelain")
    _git(checkout, "reset", "-q", "--hard")
    _git(checkout, "clean", "-q", "-fd")
    return proc, status


@pytest.mark.parametrize("command", CHEAP_RUNS.values(), ids=CHEAP_RUNS.keys())
def test_cheap_run_leaves_the_tree_clean(checkout, command):
    proc, status = _run_and_status(checkout, command)
    assert proc.returncode == 0, f"python {' '.join(command)} failed:\n{proc.stderr}"
    assert status == "", f"python {' '.join(command)} changed the checkout:\n{status}"


@pytest.mark.parametrize("script", ["benchmarks/bench_mha.py", "benchmarks/variants.py"])
def test_quick_write_is_refused(checkout, script):
    proc, status = _run_and_status(checkout, [script, "--quick", "--write"])
    assert proc.returncode == 2, proc.stdout  # argparse's usage error
    assert "--write" in proc.stderr and "full run" in proc.stderr, proc.stderr
    assert status == ""


def test_one_case_cannot_write_the_committed_docs(checkout):
    proc, status = _run_and_status(checkout, ["benchmarks/bench_mha.py", "--case", "float32:1:2048", "--write"])
    assert proc.returncode == 2, proc.stdout  # argparse's usage error, before any timing
    assert "--case" in proc.stderr and "full run" in proc.stderr, proc.stderr
    assert status == ""


def test_variants_out_writes_only_into_the_given_directory(checkout, tmp_path):
    command = ["benchmarks/variants.py", "--quick", "--min-time", "0", "--max-repeats", "1", "--out", str(tmp_path)]
    proc, status = _run_and_status(checkout, command)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["variants_costs.md", "variants_costs.png"]
    header = (tmp_path / "variants_costs.md").read_text().splitlines()[2]
    # the exact command of the run, not a hard-coded one (a --quick run never claims --write)
    assert f"by `python benchmarks/variants.py {' '.join(command[1:])}`" in header, header
    assert re.match(r"Generated on \d{4}-\d\d-\d\d \(UTC\)", header), header
    assert status == ""
