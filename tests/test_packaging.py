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
    assert "install_leg oldest 3.10 .ci/oldest-constraints.txt" in run
    assert "install_leg newest 3.13" in run
    assert 'install_leg interop 3.11 "" interop' in run  # the cross-checks against torch and transformers run
    for leg in ("oldest", "newest", "interop", "interop-newest", "book"):
        assert f"test_leg {leg}" in run, leg
    cfg_interop = configparser.ConfigParser()
    cfg_interop.read(ROOT / "setup.cfg")
    pins = sorted(cfg_interop["options.extras_require"]["interop"].split())
    assert pins == ["torch==2.13.0", "transformers==4.57.1"], pins  # exact pins: never an unpinned torch
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert cfg["options"]["python_requires"].strip() == ">=3.10"


def test_ci_reads_each_legs_exit_status_from_its_own_run():
    """A leg's status is its own pytest's, written beside its log and read back for the verdict:
    a status read from a later command (a tee, a pipeline) would turn a red leg green."""
    run = (ROOT / ".ci" / "run").read_text()
    assert '>> ".venv-ci/$name.log" 2>&1 && status=0 || status=$?' in run
    assert 'echo "$status" > ".venv-ci/$name.status"' in run
    assert 'status="$(cat ".venv-ci/$name.status")"' in run
    assert "| tee" not in run  # no pipeline between a command and the status read after it
