"""Spot the bug: every buggy backward fails the checker as written and passes once its one
fix is applied; the CLI writes the file, says "not fixed yet" with the checker's report, and
names the bug once it is fixed."""
import numpy as np
import pytest

from attention_ref.exercises import EXERCISES, check
from attention_ref.exercises.bugs import BUGS
from attention_ref.exercises.command import bug_file, main


def _function(source, name):
    namespace = {"np": np}
    exec(compile(source, "bug", "exec"), namespace)
    return namespace[name]


def test_there_are_at_least_eight_bugs_over_several_exercises():
    assert len(BUGS) >= 8
    assert len({b.exercise for b in BUGS.values()}) >= 6
    assert all(b.exercise in EXERCISES for b in BUGS.values())


@pytest.mark.parametrize("name", list(BUGS))
def test_the_bug_fails_and_its_fix_passes(name):
    bug = BUGS[name]
    assert bug.source.count(bug.fix[0]) == 1, "the fix must point at one place"
    with np.errstate(all="ignore"):
        for seed in range(3):
            assert not check(bug.exercise, _function(bug.source, bug.exercise), seed=seed).ok, f"seed {seed}"
            fixed = bug.source.replace(*bug.fix)
            result = check(bug.exercise, _function(fixed, bug.exercise), seed=seed)
            assert result.ok, f"seed {seed}:\n{result}"


def test_from_start_to_fixed_on_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bug", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in BUGS)
    assert main(["bug", "start", "softmax-axis"]) == 0
    path = tmp_path / "bug_softmax_axis.py"
    assert path.read_text() == bug_file("softmax-axis", "bug_softmax_axis.py")
    capsys.readouterr()
    assert main(["bug", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("NOT FIXED YET: softmax-axis") and "softmax_backward: FAIL" in out
    path.write_text(path.read_text().replace(*BUGS["softmax-axis"].fix))
    assert main(["bug", "check", str(path)]) == 0
    out = capsys.readouterr().out.replace("\n  ", " ")
    assert out.startswith("FIXED: softmax-axis") and BUGS["softmax-axis"].sentence in out
    assert main(["bug", "check", str(path), "--seed", "7"]) == 0  # the same options as check
    assert capsys.readouterr().out.startswith("FIXED: softmax-axis")
    assert main(["bug", "start", "softmax-axis"]) == 2  # never overwrites without --force


def test_a_bug_file_without_BUG_is_refused(tmp_path):
    path = tmp_path / "x.py"
    path.write_text('EXERCISE = "softmax_backward"\n\ndef softmax_backward(dy, cache):\n    return dy\n')
    with pytest.raises(SystemExit, match="must set BUG"):
        main(["bug", "check", str(path)])


def test_bug_files_fit_80_columns():
    for name in BUGS:
        text = bug_file(name, f"bug_{name}.py")
        assert max(len(line) for line in text.splitlines()) <= 80, name


@pytest.mark.parametrize("name", list(BUGS))
def test_a_story_says_where_to_look_not_the_fix(name):
    """Issue 29: `bug list` gave answers away ("the sum runs along a fixed axis"). A story names
    the function's outputs that are wrong, never the wrong or the right text."""
    bug = BUGS[name]
    outputs = {"softmax_backward": "dx", "linear_backward": "dW db", "scaled_dot_product_attention_backward": "dq dk",
               "layer_norm_backward": "dx", "split_heads_backward": "dx", "merge_heads_backward": "dheads",
               "flash_attention_backward": "dq dk dv"}[bug.exercise].split()
    assert any(o in bug.story.split() or o + "," in bug.story or o + ";" in bug.story for o in outputs), bug.story
    wrong, right = (set(t.replace("(", " ").replace(")", " ").replace(",", " ").split()) for t in bug.fix)
    for token in (wrong ^ right) - {"#", "the", "a"}:  # what the fix changes is never in the story
        assert token not in bug.story.split(), (token, bug.story)
    for phrase in ("fixed axis", "derivative s (1 - s)", "wrong axis", "only reshapes", "wrong order",
                   "copied from the line above", "row sums D"):
        assert phrase not in bug.story, phrase


@pytest.mark.parametrize("name", list(BUGS))
def test_each_bug_lives_in_a_python_file_a_linter_sees(name):
    import importlib

    module = importlib.import_module(f"attention_ref.exercises.bug_files.{name.replace('-', '_')}")
    bug = BUGS[name]
    assert callable(getattr(module, bug.exercise)) and module.__doc__.startswith(f"Spot the bug {name}:")
    compile(bug.source.replace(*bug.fix), "fixed", "exec")  # the fix keeps it Python
