"""python -m attention_ref exercise list | start | hint | check: from a skeleton to a pass."""
import subprocess
import sys

import pytest

from attention_ref.exercises import EXERCISES
from attention_ref.exercises.command import main

SOLUTION = '''

def softmax_backward(dy, cache):
    y = cache.y
    return y * (dy - (y * dy).sum(axis=cache.axis, keepdims=True))
'''


def test_list_names_every_exercise(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EXERCISES)


def test_from_start_to_a_passing_check_with_the_hints_only(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["start", "softmax_backward"]) == 0
    path = tmp_path / "softmax_backward.py"
    text = path.read_text()
    assert 'EXERCISE = "softmax_backward"' in text and "def softmax_backward(dy, cache):" in text
    assert "exercise check softmax_backward.py" in text
    assert main(["check", str(path)]) == 1  # the skeleton raises NotImplementedError
    assert "softmax_backward is not written yet" in capsys.readouterr().out
    assert main(["hint", "softmax_backward", "3"]) == 0
    assert "dx_i = sum_j dy_j y_j (delta_ij - y_i) = y_i (dy_i - sum_j y_j dy_j)" in \
        capsys.readouterr().out.replace("\n    ", " ")
    path.write_text(text.split("def softmax_backward")[0] + SOLUTION.lstrip())  # what hint 3 says
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out.startswith("softmax_backward: PASS on 19 cases")
    assert main(["start", "softmax_backward"]) == 2  # never overwrites without --force
    assert "--force" in capsys.readouterr().err


def test_a_wrong_attempt_in_a_file_is_named_and_exits_non_zero(tmp_path, capsys):
    path = tmp_path / "attempt.py"
    path.write_text('EXERCISE = "softmax_backward"\n\n\ndef softmax_backward(dy, cache):\n'
                    '    return dy * cache.y * (1 - cache.y)\n')
    assert main(["check", str(path)]) == 1
    assert "you kept only the diagonal of the softmax Jacobian" in capsys.readouterr().out


def test_every_skeleton_imports_and_is_reported_as_not_written(tmp_path, capsys):
    for name in EXERCISES:
        path = tmp_path / f"{name}.py"
        assert main(["start", name, str(path)]) == 0
        assert main(["check", str(path)]) == 1
        assert f"{name} is not written yet" in capsys.readouterr().out


def test_the_main_command_dispatches_to_the_exercises(tmp_path):
    import os
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this checkout, installed or not
    run = subprocess.run([sys.executable, "-m", "attention_ref", "exercise", "hint", "linear_backward"],
                         capture_output=True, text=True, cwd=tmp_path, env=env)
    assert run.returncode == 0 and run.stdout.startswith("hint 1 of 3:")


def test_files_that_do_not_exist_or_do_not_run_are_named(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="no such file"):
        main(["check", str(tmp_path / "missing.py")])
    broken = tmp_path / "broken.py"
    broken.write_text('EXERCISE = "softmax_backward"\ndef softmax_backward(dy, cache)\n')
    with pytest.raises(SystemExit) as info:
        main(["check", str(broken)])
    assert "does not run (line 2): SyntaxError" in " ".join(str(info.value).split())  # wrapped to 80 columns
    assert main(["start", "linear_backward", str(tmp_path / "new" / "folder" / "l.py")]) == 0



def test_skeletons_fit_80_columns_and_a_name_given_as_path_is_answered(tmp_path, monkeypatch):
    import pytest

    monkeypatch.chdir(tmp_path)
    for name in EXERCISES:
        assert main(["start", name]) == 0
        assert max(len(line) for line in (tmp_path / f"{name}.py").read_text().splitlines()) <= 80, name
    with pytest.raises(SystemExit, match=r"^softmax_backward: no such file; did you mean softmax_backward.py\?$"):
        main(["check", "softmax_backward"])
    with pytest.raises(SystemExit, match=r"exercise start linear \[PATH\]|exercise start <exercise>"):
        main(["check", "linear"])


def test_skeletons_list_every_cache_field_and_point_to_the_forward_only():
    from attention_ref.exercises.command import skeleton

    for name, e in EXERCISES.items():
        text = skeleton(name, f"{name}.py")
        assert f"python -m pydoc attention_ref.{e.forward_name}\n" in text
        out, cache = e.forward(*e.cases(__import__("numpy").random.default_rng(0))[0].inputs)
        fields = getattr(cache, "_fields", ())
        listed = " ".join(f for f, _ in e.cache_fields)
        assert all(f in listed for f in fields), (name, fields, listed)
    flash = skeleton("flash_attention_backward", "f.py")
    assert "row_max: (..., Nq)" in flash and "log_row_sum: (..., Nq)" in flash
    assert "causal rule, the window and the" in flash.replace("\n", " ")


def test_next_suggests_the_next_unread_hint_then_says_none_is_left(tmp_path, capsys):
    path = tmp_path / "attempt.py"
    path.write_text('EXERCISE = "softmax_backward"\n\n\ndef softmax_backward(dy, cache):\n    return dy\n')
    main(["check", str(path)])
    assert "next: hint 1 of 3:" in capsys.readouterr().out
    main(["hint", "softmax_backward", "1"])
    main(["hint", "softmax_backward", "2"])
    capsys.readouterr()
    main(["check", str(path)])
    assert "next: hint 3 of 3:" in capsys.readouterr().out
    main(["hint", "softmax_backward", "3"])
    capsys.readouterr()
    main(["check", str(path)])
    out = capsys.readouterr().out
    assert "next: all 3 hints are read" in out and "python -m pydoc attention_ref.softmax_forward" in out


def test_a_dtype_problem_is_not_sent_to_the_hints(tmp_path, capsys):
    path = tmp_path / "attempt.py"
    path.write_text('import numpy as np\nEXERCISE = "softmax_backward"\n\n\ndef softmax_backward(dy, cache):\n'
                    '    y = cache.y.astype(np.float32)\n'
                    '    return y * (dy - (y * dy).sum(axis=cache.axis, keepdims=True))\n')
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "next: compute each gradient in its input's dtype" in out and "hint 1" not in out


def test_the_table_shows_the_expected_shape_and_the_size_of_the_error(capsys):
    from attention_ref.exercises import check

    result = str(check("linear_backward", lambda dy, c: (dy @ c.W.T, dy.reshape(-1, dy.shape[-1]).T @ c.x.reshape(
        -1, c.x.shape[-1]), dy.reshape(-1, dy.shape[-1]).sum(0) if c.has_bias else None)))
    assert "WRONG (expected (" in result
    result = str(check("softmax_backward", lambda dy, c: 2 * c.y * (dy - (c.y * dy).sum(c.axis, keepdims=True))))
    assert "WRONG (max error" in result and "max |true|" in result


# -- issue 41 item 4: folders and names near the file system's limit -------------------------------

def test_start_onto_a_folder_and_check_of_a_folder_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "afolder").mkdir()
    assert main(["start", "softmax_backward", str(tmp_path / "afolder"), "--force"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is a folder" in err
    with pytest.raises(SystemExit) as info:
        main(["check", str(tmp_path / "afolder")])
    assert "is a folder" in str(info.value) and len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("length", [230, 240, 252, 255])
def test_names_near_the_file_systems_limit_work(tmp_path, length, capsys):
    name = "s" * (length - 3) + ".py"
    assert main(["start", "softmax_backward", str(tmp_path / name)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no temporary left
    assert main(["check", str(tmp_path / name)]) == 1  # the skeleton: not written yet
    assert "is not written yet" in capsys.readouterr().out


def test_a_300_byte_name_is_refused_by_name_in_one_line(tmp_path, capsys):
    path = str(tmp_path / ("x" * 297 + ".py"))
    assert main(["start", "softmax_backward", path]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is 300 bytes long, more than this file system allows" in err
    with pytest.raises(SystemExit) as info:
        main(["check", path])
    said = str(info.value)
    assert len(said.splitlines()) == 1 and "is 300 bytes long" in said and len(said) <= 160
    assert list(tmp_path.iterdir()) == []


def test_the_skeletons_state_the_broadcast_rule_and_the_encoders_cache(tmp_path):
    from attention_ref.exercises.command import skeleton

    for name in ("linear_backward", "layer_norm_backward", "scaled_dot_product_attention_backward",
                 "flash_attention_backward", "multi_head_attention_backward", "encoder_block_backward"):
        text = " ".join(skeleton(name, "x.py").split())
        assert "gets its gradient summed over that axis, back to its own shape" in text, name
    text = " ".join(skeleton("encoder_block_backward", "x.py").split())
    assert "FeedForwardCache: fc1 (LinearCache: x, W, has_bias), h (..., n, d_ff) the pre-activation" in text
    assert "rstd (..., n, 1) = 1/sqrt(var + eps)" in text and "attn.sublayer.attention.scale" in text
