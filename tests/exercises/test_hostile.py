"""Hostile student files: the student's code runs in a forked child (docs/exercises.md, "The
checker as a process"), so a thread that never ends, an ignored alarm, a fork, a huge allocation
or a file deletion in the current folder cannot keep the checker alive, take its memory or touch
the student's folder; and the caller's signal handlers, NumPy settings and folder stay as they
were."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from attention_ref import softmax_backward
from attention_ref.exercises import check

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the child process needs fork (POSIX)")
RIGHT = "    return cache.y * (dy - (cache.y * dy).sum(axis=cache.axis, keepdims=True))\n"
LIMIT = 1.0

#: name -> (code at the top of the file, the backward's body)
HOSTILE = {
    "a non-daemon thread": ("import threading, time\n"
                            "threading.Thread(target=time.sleep, args=(1000,)).start()", RIGHT),
    "an ignored alarm and a loop": ("import signal", "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
                                                     "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])\n"
                                                     "    while True:\n        pass\n"),
    "a fork that sleeps": ("import os, time", "    if os.fork() == 0:\n        time.sleep(1000)\n" + RIGHT),
    "a huge allocation": ("", "    big = np.ones((1 << 40,))\n" + RIGHT),
    "deleting *.txt here": ("from pathlib import Path\nfor p in Path('.').glob('*.txt'):\n    p.unlink()",
                            "    for p in Path('.').glob('*.txt'):\n        p.unlink()\n"
                            "    Path('made_by_the_student.txt').write_text('x')\n" + RIGHT),
}


def _file(folder, top, body):
    path = folder / "attempt.py"
    path.write_text(f"import sys\nimport numpy as np\n{top}\nEXERCISE = \"softmax_backward\"\n\n\n"
                    f"def softmax_backward(dy, cache):\n{body}")
    return path


def _folder(tmp_path):
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "data.txt").write_text("also mine")
    return folder


def _contents(folder):
    return sorted((p.name, p.read_bytes()) for p in folder.iterdir() if p.name != "__pycache__")


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_file_ends_within_its_time_limit_and_leaves_the_folder_as_it_was(tmp_path, name):
    folder = _folder(tmp_path)
    path = _file(folder, *HOSTILE[name])
    before = _contents(folder)
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "attention_ref", "exercise", "check", path.name, "--time-limit",
                          str(LIMIT)], capture_output=True, text=True, cwd=folder, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = time.monotonic() - started
    said = " ".join((run.stdout + run.stderr).split())
    assert took < 20, (took, said)  # the import of numpy and the cases, and the limit once
    assert _contents(folder) == before, said
    if name in ("an ignored alarm and a loop",):
        assert run.returncode == 1 and "ran out of time on case 1" in said and "did not stop when told" in said
    elif name == "a huge allocation":
        assert run.returncode == 1 and "MemoryError" in said, said
    else:
        assert run.returncode == 0 and "PASS" in said, said


def test_hostile_attempts_given_to_check_leave_the_caller_as_it_was(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("mine")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGALRM, signal.SIGINT, signal.SIGTERM)}
    err = np.geterr()

    def ignores_the_alarm(dy, cache):
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        np.seterr(all="raise")
        os.chdir("/")
        while True:
            pass

    def deletes(dy, cache):
        for p in Path(".").glob("*.txt"):
            p.unlink()
        return softmax_backward(dy, cache)

    started = time.monotonic()
    result = check("softmax_backward", ignores_the_alarm, time_limit=0.5)
    assert time.monotonic() - started < 10
    assert not result.ok and "ran out of time on case 1" in result.diagnosis
    assert "did not stop when told" in result.diagnosis
    assert check("softmax_backward", deletes).ok
    assert (tmp_path / "keep.txt").read_text() == "mine" and os.getcwd() == str(tmp_path)
    assert {s: signal.getsignal(s) for s in handlers} == handlers and np.geterr() == err


def test_what_the_students_code_prints_is_shown(capfd):
    def prints(dy, cache):
        print("hello from the backward")
        return softmax_backward(dy, cache)

    assert check("softmax_backward", prints).ok
    assert "hello from the backward" in capfd.readouterr().out


def test_the_memory_limit_is_an_option(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS is enforced on Linux")

    def takes_400_mib(dy, cache):
        big = np.ones(50 * 2**20)  # 400 MiB
        assert big[-1] == 1.0
        return softmax_backward(dy, cache)

    assert check("softmax_backward", takes_400_mib).ok  # the default, 4096 MiB, allows it
    small = check("softmax_backward", takes_400_mib, memory_limit=100)
    assert not small.ok and "MemoryError" in small.diagnosis
    with pytest.raises(ValueError, match="memory_limit must be a number of MiB > 0"):
        check("softmax_backward", softmax_backward, memory_limit=0)


def test_an_attempt_that_ends_its_process_is_told_so():
    def exits_hard(dy, cache):
        os._exit(0)

    result = check("softmax_backward", exits_hard)
    assert not result.ok and "ended the process it ran in on case 1" in result.diagnosis


def test_ctrl_c_in_the_caller_ends_the_child(tmp_path):
    marker = tmp_path / "child.pid"
    script = (f"import os, time\nfrom attention_ref.exercises import check\n"
              f"def slow(dy, cache):\n    open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
              f"    time.sleep(1000)\n"
              f"try:\n    check('softmax_backward', slow, time_limit=None)\nexcept KeyboardInterrupt:\n"
              f"    print('interrupted')\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    child = int(marker.read_text())
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert "interrupted" in out
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_an_attempt_that_ends_its_process_after_forking_is_told_so_at_once():
    """A process the attempt started holds the child's pipes open; the child's end is seen all
    the same."""
    def forks_then_exits(dy, cache):
        if os.fork() == 0:
            time.sleep(1000)
        os._exit(3)

    started = time.monotonic()
    result = check("softmax_backward", forks_then_exits, time_limit=None)
    assert time.monotonic() - started < 15
    assert not result.ok and "ended the process it ran in on case 1" in result.diagnosis
    assert "exited with status 3" in result.diagnosis
