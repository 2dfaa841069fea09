"""Hostile input to the command line and to the file writers and readers: a one-line error naming the
argument, file or field, never a traceback; names at the file system's limit work, names past it
are refused naming them (not a temporary file the user never asked for)."""
import errno
import json
import os
import struct
from pathlib import Path

import pytest

from attention_ref._atomic import write_atomic
from attention_ref.interop import read_safetensors
from tests._helpers import run_package

ROOT = Path(__file__).resolve().parents[1]
NAME_MAX = os.pathconf(ROOT, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255


def _cli(*args, cwd):
    return run_package(*args, cwd=cwd, timeout=300)


def _one_line(result, *words):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], f"{word!r} not in: {lines[0]}"
    return lines[0]


# ------------------------------------------------------------------ a safetensors header's fields
@pytest.mark.parametrize("dtype", [["F32"], {"name": "F32"}, 4, None, True])
def test_a_dtype_that_is_not_a_name_is_refused_naming_the_file_and_field(tmp_path, dtype):
    header = json.dumps({"w": {"dtype": dtype, "shape": [1], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(ValueError) as e:
        read_safetensors(path)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{path}: tensor 'w': field 'dtype' is "), message


# ------------------------------------------------------------------ the atomic writer at the name limit
@pytest.mark.parametrize("size", [NAME_MAX - 25, NAME_MAX - 10, NAME_MAX - 1, NAME_MAX])
def test_names_up_to_the_limit_are_written(tmp_path, size):
    target = tmp_path / ("a" * (size - 3) + ".py")
    write_atomic(target, "x = 1\n")
    assert target.read_text() == "x = 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temporary file left


def test_a_name_past_the_limit_is_refused_naming_it(tmp_path):
    target = tmp_path / ("a" * (NAME_MAX - 2) + ".py")
    with pytest.raises(OSError) as e:
        write_atomic(target, "x")
    assert e.value.errno == errno.ENAMETOOLONG and e.value.filename == str(target)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_is_not_overwritten(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("mine")
    with pytest.raises(IsADirectoryError) as e:
        write_atomic(tmp_path / "d", "x")
    assert e.value.filename == str(tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and (tmp_path / "d" / "keep").read_text() == "mine"


# ------------------------------------------------------------------ the command line
def test_plots_into_a_file_is_one_line_before_any_work(tmp_path):
    (tmp_path / "f").write_text("")
    result = _cli("--plots", "f", cwd=tmp_path)
    assert _one_line(result, "--plots f", "File exists") and result.returncode == 2
    assert result.stdout == ""  # refused before the walkthrough ran


def test_plots_with_a_name_too_long_is_one_line(tmp_path):
    _one_line(_cli("--section", "summary", "--plots", "p" * (NAME_MAX + 1), cwd=tmp_path), "--plots", "too long")


def test_spot_the_bug_onto_a_folder_is_one_line_naming_it(tmp_path):
    (tmp_path / "d").mkdir()
    _one_line(_cli("exercise", "bug", "start", "softmax-axis", "d", "--force", cwd=tmp_path), "d", "folder")
    assert list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize("size", [NAME_MAX - 20, NAME_MAX])
def test_spot_the_bug_at_the_name_limit_works(tmp_path, size):
    name = "b" * (size - 3) + ".py"
    result = _cli("exercise", "bug", "start", "softmax-axis", name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize("command", [("exercise", "bug", "start", "softmax-axis"), ("exercise", "bug", "check"),
                                     ("book",)])
def test_a_name_past_the_limit_is_one_line(tmp_path, command):
    name = "c" * (NAME_MAX + 10)
    line = _one_line(_cli(*command, name + ".py", cwd=tmp_path), name[:20])  # the name, perhaps shortened in the middle
    assert ".tmp" not in line  # the user's name, not a temporary one
    assert list(tmp_path.iterdir()) == []
