"""setup.cfg's lower bounds are exactly what CI's oldest leg pins, so they are proven."""
import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _requirements(text: str) -> dict:
    """'name>=1.24' lines -> {'name': '1.24'}."""
    return dict(re.findall(r"^\s*([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)\s*$", text, flags=re.M))


def test_every_lower_bound_is_pinned_by_the_oldest_ci_leg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    bounds = _requirements(cfg["options"]["install_requires"])
    bounds |= _requirements(cfg["options.extras_require"]["test"])
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([0-9.]+)\.\*$",
                           (ROOT / ".ci" / "oldest-constraints.txt").read_text(), flags=re.M))
    assert {"numpy", "matplotlib"} <= set(bounds)
    assert pins == bounds, f"setup.cfg lower bounds {bounds} != .ci/oldest-constraints.txt pins {pins}"


def test_ci_runs_both_ends_of_the_matrix():
    run = (ROOT / ".ci" / "run").read_text()
    assert "run_leg oldest 3.10 .ci/oldest-constraints.txt" in run
    assert "run_leg newest 3.13" in run
    assert 'run_leg interop 3.11 "" interop' in run  # the cross-checks against torch and transformers run
    cfg_interop = configparser.ConfigParser()
    cfg_interop.read(ROOT / "setup.cfg")
    pins = sorted(cfg_interop["options.extras_require"]["interop"].split())
    assert pins == ["torch==2.13.0", "transformers==4.57.1"], pins  # exact pins: never an unpinned torch
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options"]["python_requires"].strip() == ">=3.10"


def test_ci_reads_each_legs_exit_status_from_its_own_pipeline():
    """PIPESTATUS belongs to the last pipeline: read anywhere later, a red leg reads green."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    tee = next(i for i, line in enumerate(lines) if line.strip().startswith(") 2>&1 | tee"))
    assert lines[tee + 1].strip().startswith("status=${PIPESTATUS[0]}"), lines[tee + 1]
