"""python -m attention_ref exercise list | start | hint | check: from a skeleton to a pass."""
import subprocess
import sys

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
    assert capsys.readouterr().out.startswith("softmax_backward: PASS on 5 cases")
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
    run = subprocess.run([sys.executable, "-m", "attention_ref", "exercise", "hint", "linear_backward"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.startswith("hint 1 of 3:")


def test_files_that_do_not_exist_or_do_not_run_are_named(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="no such file"):
        main(["check", str(tmp_path / "missing.py")])
    broken = tmp_path / "broken.py"
    broken.write_text('EXERCISE = "softmax_backward"\ndef softmax_backward(dy, cache)\n')
    with pytest.raises(SystemExit, match=r"does not run \(line 2\): SyntaxError"):
        main(["check", str(broken)])
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
