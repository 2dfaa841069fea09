"""The checker as a process: student code that exits, is interrupted or never ends is reported
as such with a non-zero status; the caller's NumPy settings survive a check; the hint state is
kept safely where XDG says; argument errors are one line; every line fits 80 columns."""
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from attention_ref import multi_head_attention_backward, softmax_backward
from attention_ref.exercises import EXERCISES, check
from attention_ref.exercises.command import main
from tests._helpers import run_package

ROOT = Path(__file__).resolve().parents[2]
RIGHT = "    return cache.y * (dy - (cache.y * dy).sum(axis=cache.axis, keepdims=True))\n"


def _cli(*args, cwd, env=None):
    return run_package("exercise", *args, cwd=cwd, env=env)


def _file(tmp_path, body, name="attempt.py", exercise="softmax_backward", extra=""):
    path = tmp_path / name
    path.write_text(f"import sys\nimport numpy as np\nEXERCISE = \"{exercise}\"\n{extra}\n\n"
                    f"def {exercise}(dy, cache):\n{body}")
    return path


# -- sys.exit, SystemExit, KeyboardInterrupt: reported, never a silent exit 0 ----------------

@pytest.mark.parametrize("where", ["import", "backward"])
@pytest.mark.parametrize("command", [("check",), ("bug", "check")])
def test_sys_exit_0_from_the_students_file_is_a_failure_that_says_so(tmp_path, where, command):
    at_import = "sys.exit(0)" if where == "import" else "BUG = \"softmax-axis\""
    body = "    sys.exit(0)\n" if where == "backward" else RIGHT
    extra = at_import + ("\nBUG = \"softmax-axis\"" if where == "import" else "")
    path = _file(tmp_path, body, extra=extra)
    run = _cli(*command, str(path), cwd=tmp_path)
    assert run.returncode != 0, (run.stdout, run.stderr)
    said = " ".join((run.stdout + run.stderr).split())
    assert "sys.exit(0) (SystemExit)" in said, said
    assert "imported" in said if where == "import" else "on case 1" in said


@pytest.mark.parametrize("stop, words", [(SystemExit(3), "called sys.exit(3) (SystemExit) on case 1"),
                                         (KeyboardInterrupt(), "was interrupted (KeyboardInterrupt) on case 1")])
def test_exit_and_interrupt_in_the_backward_fail_and_name_the_case(stop, words):
    def attempt(dy, cache):
        raise stop

    result = check("softmax_backward", attempt)
    assert not result.ok and result.diagnosis.startswith("your backward " + words)
    assert "at line" in result.diagnosis  # the student's line that exited


def test_exit_in_a_students_forward_is_reported():
    def forward(x, axis=-1):
        sys.exit("bye")

    result = check("softmax_backward", softmax_backward, forward=forward)
    assert not result.ok and result.diagnosis.startswith("your forward called sys.exit('bye')")


# -- a time limit per case, that names the case -----------------------------------------------

#: CPython 3.10 does not look for pending signals on the jump back of a loop whose body is a try
#: statement (3.11 does), so the alarm cannot stop such a loop there: docs/exercises.md says so
CATCH_ALL_SEES_SIGNALS = sys.version_info >= (3, 11)

def test_an_endless_backward_runs_out_of_time_on_the_case_it_loops_on():
    def endless_on_case_5(dy, cache):
        if dy.ndim == 4 and CATCH_ALL_SEES_SIGNALS:  # case 5 of the softmax exercise is the first 4-d one
            while True:
                try:
                    pass
                except Exception:  # noqa: BLE001  (a student's catch-all does not stop the limit)
                    pass
        while dy.ndim == 4:  # CPython 3.10: the same loop without the try statement
            pass
        return softmax_backward(dy, cache)

    result = check("softmax_backward", endless_on_case_5, time_limit=0.3)
    assert not result.ok
    assert result.diagnosis.startswith("your backward ran out of time on case 5 (inputs (")
    assert "more than 0.3 s" in result.diagnosis
    assert "case 5: inputs" in str(result) and "ran out of time" in str(result)


def test_the_limit_is_per_case_and_a_callers_alarm_runs_on(tmp_path):
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        assert check("softmax_backward", softmax_backward, time_limit=0.5).ok
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20.0 < left <= 30.0  # the caller's timer is set again with what was left of it
        assert signal.getsignal(signal.SIGALRM) is not None and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_an_endless_file_runs_out_of_time_from_the_command_line(tmp_path):
    looping = _file(tmp_path, "    while True:\n        pass\n")
    run = _cli("check", str(looping), "--time-limit", "0.5", cwd=tmp_path)
    assert run.returncode == 1 and "ran out of time on case 1" in " ".join(run.stdout.split())
    at_import = _file(tmp_path, RIGHT, name="at_import.py", extra="while True:\n    pass")
    run = _cli("check", str(at_import), "--time-limit", "0.5", cwd=tmp_path)
    assert run.returncode == 1 and "did not finish importing within 0.5 s" in " ".join(run.stderr.split())


# -- the caller's NumPy settings are the caller's again ------------------------------------------

def test_numpy_settings_changed_by_the_attempt_are_restored():
    before_err, before_print = np.geterr(), np.get_printoptions()
    np.random.seed(123)
    expected_next = np.random.random_sample()
    np.random.seed(123)

    def meddling(dy, cache):
        np.seterr(all="raise")
        np.set_printoptions(precision=2, linewidth=20)
        np.random.seed(9)
        np.random.random_sample(5)
        return softmax_backward(dy, cache)

    assert not check("softmax_backward", meddling).ok or True  # the verdict is not the point here
    assert np.geterr() == before_err and np.get_printoptions() == before_print
    assert np.random.random_sample() == expected_next


# -- the hint state: XDG_CACHE_HOME, a malformed file set aside, writes that replace --------------

def test_the_state_follows_xdg_cache_home(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ATTENTION_REF_STATE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert main(["hint", "softmax_backward", "2"]) == 0
    state = tmp_path / "xdg" / "attention_ref" / "hints.json"
    assert state.read_text() == '{"softmax_backward": [2]}'
    assert [p.name for p in state.parent.iterdir()] == ["hints.json"]  # no temporary file left


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"softmax_backward": 5}', '{"x": ["1"]}', "\udcff"])
def test_a_malformed_state_is_set_aside_with_a_one_line_note(tmp_path, text, capsys):
    state = Path(os.environ["ATTENTION_REF_STATE_DIR"])
    state.mkdir(parents=True)
    (state / "hints.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    assert main(["hint", "softmax_backward", "1"]) == 0
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("note: ") and "moved to hints.json.bad" in err
    assert (state / "hints.json.bad").read_bytes() == text.encode("utf-8", "surrogateescape")  # kept
    assert (state / "hints.json").read_text() == '{"softmax_backward": [1]}'
    path = _file(tmp_path, "    return dy\n")
    assert main(["check", str(path)]) == 1
    assert "next: hint 2 of 3:" in capsys.readouterr().out


# -- argument errors are one line ------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["check", "f.py", "--seed", "-1"], "--seed must be >= 0, got -1"),
    (["check", "f.py", "--seed", "x"], "--seed must be a whole number, got 'x'"),
    (["check", "f.py", "--time-limit", "0"], "--time-limit must be a number of seconds > 0, got '0'"),
    (["bug", "check", "f.py", "--seed", "-1"], "--seed must be >= 0, got -1"),
    (["bug", "check", "f.py", "--time-limit", "nan"], "--time-limit must be a number of seconds > 0"),
    (["hint", "softmax_backward", "0"], "the hint number must be >= 1, got 0"),
    (["start", "softmax"], "no exercise 'softmax' (python -m attention_ref exercise list)"),
    (["bug", "start", "nope"], "no bug 'nope' (python -m attention_ref exercise bug list)"),
    ([], "the following arguments are required: action"),
])
def test_argument_errors_are_one_line_within_80_columns(args, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.splitlines()) == 1 and words in err, err
    assert len(err.rstrip("\n")) <= 80, err


def test_check_rejects_a_bad_seed_or_time_limit_in_one_line():
    for kwargs in ({"seed": -1}, {"seed": 1.5}, {"seed": True}, {"time_limit": 0}, {"time_limit": "5"}):
        with pytest.raises(ValueError) as info:
            check("softmax_backward", softmax_backward, **kwargs)
        assert len(str(info.value).splitlines()) == 1


def test_messages_from_the_command_fit_80_columns(tmp_path, capsys):
    path = _file(tmp_path, RIGHT, extra="EXERCISE = 'no_such_exercise'")
    with pytest.raises(SystemExit) as info:
        main(["check", str(path)])
    assert "must set EXERCISE" in " ".join(str(info.value).split())
    assert all(len(line) <= 80 for line in str(info.value).splitlines() if str(tmp_path) not in line)
    assert main(["bug", "list"]) == 0 and main(["list"]) == 0
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) <= 80


# -- reports: aligned tables within 80 columns, the function's own names, no dangling words --------

def test_long_parameter_names_keep_the_table_aligned_within_80_columns():
    from attention_ref.nn.encoder_block import encoder_block_backward

    def one_wrong(dout, cache):
        dx, grads = encoder_block_backward(dout, cache)
        return dx, {**grads, "ffn.W_1": 2 * grads["ffn.W_1"]}

    report = str(check("encoder_block_backward", one_wrong))
    lines = report.splitlines()
    assert max(map(len, lines)) <= 80
    rows = [line for line in lines if line.startswith("  ") and " shape (" in line]
    assert len({line.index(" shape (") for line in rows}) == 1  # one column for every row
    assert any("grads['self_attn.W_q'] shape" in line for line in rows)


def test_a_dtype_next_line_has_no_dangling_words():
    def float32(dy, cache):
        y = cache.y.astype(np.float32)
        return y * (dy - (y * dy).sum(axis=cache.axis, keepdims=True))

    lines = str(check("softmax_backward", float32)).splitlines()
    assert max(map(len, lines)) <= 80 and not any(line.rstrip().endswith(", then") for line in lines)
    assert lines[-1] == "next: compute each gradient in its input's dtype (no .astype); check again"


def test_the_wrong_order_message_shows_grads_as_the_dict_it_is():
    def tuple_order(dout, cache):
        dquery, dkey, dvalue, grads = multi_head_attention_backward(dout, cache)
        return dkey, dquery, dvalue, grads

    def dict_entries(dout, cache):
        dquery, dkey, dvalue, grads = multi_head_attention_backward(dout, cache)
        return dquery, dkey, dvalue, {**grads, "W_q": grads["W_v"], "W_v": grads["W_q"]}

    order = check("multi_head_attention_backward", tuple_order).diagnosis
    assert order.endswith("return (dquery, dkey, dvalue, grads) in that order") and "W_q, b_q" not in order
    exchanged = check("multi_head_attention_backward", dict_entries).diagnosis
    assert exchanged.startswith("your W_q equals the true W_v: two entries of the dict grads are exchanged")


def test_writes_are_named_by_the_attempts_own_argument_names():
    def writes_dy(g, c):
        g *= 1.0
        g[...] = g
        c.y[...] = c.y
        out = softmax_backward(g, c)
        g += 0  # the same numbers: no write
        c.y[0] = c.y[0] + 1  # a real one
        return out

    assert "your backward wrote into c.y" in check("softmax_backward", writes_dy).diagnosis

    def scales_dout(dout, cache):
        dout *= 2
        return softmax_backward(dout, cache)

    result = check("softmax_backward", scales_dout)
    assert not result.ok and "your backward wrote into dout" in result.diagnosis


def test_every_exercise_report_fits_80_columns_for_exits_and_timeouts():
    for name, e in EXERCISES.items():
        report = str(check(name, lambda *a: sys.exit(1)))
        assert max(map(len, report.splitlines())) <= 80, report
