"""Every writer leaves a file old or new, never partial: real SIGKILLs at random moments and a full disk.

The writers are killed by the kernel (SIGKILL) while they rewrite files in a loop, and starved of
disk with ``RLIMIT_FSIZE`` set in a child process (the writes then fail with EFBIG, as on a full
disk); after each, every target holds one whole version, old or new, and a failed write leaves
no temporary file behind. ``_atomic``'s own contract (mode kept, temporary removed on an
exception) is tested directly.
"""
import errno
import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from attention_ref._atomic import atomic_path, write_atomic

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and resource limits")

SIZE = 1 << 20  # bytes per version: each write takes long enough to be caught in the middle


def _version(i: int) -> bytes:
    head = f"version {i:08d}\n".encode()
    return head + bytes([i % 251]) * (SIZE - len(head))


def _which_version(blob: bytes) -> int:
    """The version a file holds, or AssertionError if it is not exactly one whole version."""
    assert len(blob) == SIZE, f"partial file: {len(blob)} bytes of {SIZE}"
    i = int(blob[8:16])
    assert blob == _version(i), f"version {i} with the wrong bytes"
    return i


_LOOP = """
import sys, numpy as np
sys.path.insert(0, {root!r})
from attention_ref._atomic import atomic_path, write_atomic
sys.path.insert(0, {tests!r})
from test_atomic_writes import _version
text, arrays = sys.argv[1], sys.argv[2]
print("ready", flush=True)
i = 1
while True:
    write_atomic(text, _version(i))
    with atomic_path(arrays) as tmp:
        np.savez(tmp, v=np.full(SIZE // 8, i, dtype=np.int64))
    i += 1
""".replace("SIZE", str(SIZE))


def test_random_sigkills_leave_old_or_new(tmp_path):
    text, arrays = tmp_path / "state.txt", tmp_path / "arrays.npz"
    write_atomic(text, _version(0))
    with atomic_path(arrays) as tmp:
        np.savez(tmp, v=np.zeros(SIZE // 8, dtype=np.int64))
    rng = random.Random(0)
    seen = set()
    code = _LOOP.format(root=str(ROOT), tests=str(Path(__file__).parent))
    for _ in range(20):
        child = subprocess.Popen([sys.executable, "-c", code, str(text), str(arrays)], stdout=subprocess.PIPE)
        assert child.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        seen.add(_which_version(text.read_bytes()))
        values = np.load(arrays)["v"]
        assert values.shape == (SIZE // 8,) and (values == values[0]).all()
    assert len(seen) > 1, f"the writer never got to write: {seen}"  # the kills did land between writes


_FIGURES = """
import sys
sys.path.insert(0, {root!r})
from attention_ref.plot import save_all
save_all(sys.argv[1], ["saturation.png"])
print("ready", flush=True)
while True:
    save_all(sys.argv[1], ["saturation.png"])
"""
PNG_END = b"IEND\xaeB`\x82"  # the last chunk of every whole PNG


def _state(folder: Path):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.exists())


def test_sigkills_in_the_middle_of_a_figure_write_leave_whole_pngs(tmp_path):
    """``python -m attention_ref --plots DIR``'s writer, killed the moment its folder changes (a
    temporary file appears, or the target starts to change): the figure is the old one, whole."""
    png = tmp_path / "saturation.png"
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", _FIGURES.format(root=str(ROOT)), str(tmp_path)],
                                 stdout=subprocess.PIPE)
        assert child.stdout.readline() == b"ready\n"
        seen, deadline = _state(tmp_path), time.monotonic() + 60
        while _state(tmp_path) == seen and time.monotonic() < deadline:
            time.sleep(0.0002)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        blob = png.read_bytes()
        assert blob.startswith(b"\x89PNG\r\n\x1a\n") and blob.endswith(PNG_END), f"a partial PNG: {len(blob)} bytes"


def _starved(code: str, limit: int, cwd=ROOT):
    """Run ``code`` in a child whose files may not grow past ``limit`` bytes (EFBIG, not SIGXFSZ)."""
    preamble = ("import resource, signal, sys\n"
                f"sys.path.insert(0, {str(ROOT)!r})\n"
                "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n")
    return subprocess.run([sys.executable, "-c", preamble + code], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _only(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir())


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "state.txt"
    write_atomic(target, _version(0))
    result = _starved(f"from attention_ref._atomic import write_atomic\n"
                      f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      f"from test_atomic_writes import _version\n"
                      f"write_atomic({str(target)!r}, _version(1) + b'more')\n", limit=SIZE)
    assert result.returncode != 0 and "File too large" in result.stderr, result.stderr[-500:]
    assert _which_version(target.read_bytes()) == 0
    assert _only(tmp_path) == ["state.txt"]


@pytest.mark.parametrize("writer", ["claims", "figure", "safetensors", "notebook"])
def test_real_writers_starved_of_disk_leave_the_old_file(tmp_path, writer):
    """The committed files' writers under a 4 KiB file-size limit: each fails, the old file stays whole."""
    old = b"the old file, whole\n"
    if writer == "claims":
        target = tmp_path / "claims.md"
        code = f"import runpy; sys.argv = ['claims.py', '--write', {str(target)!r}]\n" \
               f"sys.path.insert(0, {str(ROOT / 'examples')!r})\n" \
               f"runpy.run_path({str(ROOT / 'examples' / 'claims.py')!r}, run_name='__main__')\n"
    elif writer == "figure":
        target = tmp_path / "saturation.png"
        code = f"from attention_ref.plot import save_all\nsave_all({str(tmp_path)!r}, ['saturation.png'])\n"
    elif writer == "safetensors":
        target = tmp_path / "model.safetensors"
        code = ("import numpy as np\nfrom attention_ref.interop import write_safetensors\n"
                f"write_safetensors({{'w': np.ones((64, 64), np.float32)}}, {str(target)!r})\n")
    else:
        target = tmp_path / "lesson.ipynb"
        code = (f"sys.path.insert(0, {str(ROOT / 'tests')!r})\nimport nbformat\n"
                "from attention_ref._atomic import write_atomic\n"
                "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('x = 1\\n' * 2000)])\n"
                f"write_atomic({str(target)!r}, nbformat.writes(nb))\n")
    target.write_bytes(old)
    result = _starved(code, limit=4096)
    assert result.returncode != 0 and "File too large" in result.stderr, result.stderr[-800:]
    assert target.read_bytes() == old
    assert _only(tmp_path) == [target.name], "a temporary file was left behind"


def test_the_target_keeps_its_mode_and_a_new_file_follows_the_umask(tmp_path):
    old = tmp_path / "kept.txt"
    old.write_text("old")
    os.chmod(old, 0o640)
    write_atomic(old, "new")
    assert old.read_text() == "new" and stat.S_IMODE(old.stat().st_mode) == 0o640
    mask = os.umask(0o027)
    try:
        new = write_atomic(tmp_path / "new.txt", b"bytes")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o640 and new.read_bytes() == b"bytes"


def test_an_exception_in_the_block_leaves_the_target_and_removes_the_temporary(tmp_path):
    target = tmp_path / "figure.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic_path(target) as tmp:
            assert tmp.parent == tmp_path and tmp.suffix == ".png"  # beside the target, its format's suffix
            tmp.write_bytes(b"half")
            raise RuntimeError("writer failed")
    assert target.read_bytes() == b"old" and _only(tmp_path) == ["figure.png"]


def test_json_and_text_round_trip(tmp_path):
    data = {"a": [1, 2.5, "é"]}
    path = write_atomic(tmp_path / "x.json", json.dumps(data, ensure_ascii=False))
    assert json.loads(path.read_text(encoding="utf-8")) == data


@pytest.mark.parametrize("length", [200, 230, 245, 255])
def test_a_name_near_the_file_systems_limit_gets_a_temporary_that_fits(tmp_path, length):
    """The temporary adds a dot, 8 random characters and ``.tmp`` plus the suffix: the name is
    shortened so that it fits, the suffix kept, and the write is as atomic as any other."""
    target = tmp_path / ("n" * (length - 4) + ".npz")
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and len(os.fsencode(tmp.name)) <= 255
        assert tmp.name.startswith(".nnn") and tmp.name.endswith(".tmp.npz")
        np.savez(tmp, v=np.arange(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    assert np.load(target)["v"].tolist() == [0, 1, 2]
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and len(list(tmp_path.iterdir())) == 1


def test_a_name_too_long_or_a_folder_is_refused_and_leaves_nothing(tmp_path):
    with pytest.raises(OSError) as info:
        write_atomic(tmp_path / ("n" * 300), b"x")
    assert info.value.errno == errno.ENAMETOOLONG
    (tmp_path / "a_folder").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "a_folder", b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["a_folder"]
    assert list((tmp_path / "a_folder").iterdir()) == []
