"""A child process started by a script ends with it: ``bench_mha.py``'s worker, under real signals.

The driver is started on one long case (a worker that would run for many seconds alone), a
worker is found among its children in ``/proc``, the driver gets SIGTERM, SIGINT or SIGKILL, and
the worker must be gone within a few seconds (it outlived the driver by 4-14 s before).
"""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads children from /proc (Linux)")


def _children(pid: int) -> list:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":  # its parent, and not a zombie
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_the_benchmark_worker_ends_with_the_driver(signum):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_mha.py"), "--case", "float64:4:512", "--repeats", "400",
           "--rounds", "1", "--no-torch", "--no-tricks"]
    driver = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline, workers = time.monotonic() + 60, []
        while not workers and time.monotonic() < deadline and driver.poll() is None:
            time.sleep(0.1)
            workers = _children(driver.pid)
        assert workers, "no worker started"
        time.sleep(1.0)  # the worker is measuring: 400 repeats take far longer than the wait below
        assert all(_alive(w) for w in workers)
        driver.send_signal(signum)
        driver.wait(timeout=30)
        deadline = time.monotonic() + 30.0  # a bound for a loaded machine; the wait ends once the workers are gone
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(w) for w in workers), f"worker outlived the driver's {signal.Signals(signum).name}"
        if signum != signal.SIGKILL:
            assert "Traceback" not in driver.stderr.read().decode() or signum == signal.SIGINT
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        driver.stderr.close()
