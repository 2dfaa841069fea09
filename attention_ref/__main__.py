"""``python -m attention_ref``: the step-by-step walkthrough (see :mod:`attention_ref.documents.walkthrough`);
``python -m attention_ref exercise ...``: the exercises (see :mod:`attention_ref.exercises`);
``python -m attention_ref book [OUT]``: the lessons and docs as a website (see :mod:`attention_ref.documents.book`);
``python -m attention_ref compare FOLDER FILE.py:FUNCTION``: your own model against the reference (see
:mod:`attention_ref.compare.command`)."""
import os
import sys

from .documents.walkthrough import main
from .exercises.command import main as exercise_main


def save_figures(directory):
    """--plots: matplotlib is imported only when figures are asked for."""
    from .plot import save_all

    return save_all(directory)


try:
    if sys.argv[1:2] == ["exercise"]:
        code = exercise_main(sys.argv[2:])
    elif sys.argv[1:2] == ["compare"]:
        from .compare.command import main as compare_main

        code = compare_main(sys.argv[2:])
    elif sys.argv[1:2] == ["book"]:
        from .documents.book import main as book_main

        code = book_main(sys.argv[2:])
    else:
        code = main(save_figures=save_figures)
    sys.stdout.flush()
except BrokenPipeError:  # output piped into `head` or a pager that quit early
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 0
except OSError as e:  # a path the file system refuses (too long, a folder, no permission): one line, no traceback
    path = e.filename if e.filename is not None else ""
    print(f"python -m attention_ref: {path}{': ' if path else ''}{e.strerror or e}", file=sys.stderr)
    code = 1
sys.exit(code)
