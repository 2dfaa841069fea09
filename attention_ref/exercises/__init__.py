"""Exercises: derive a backward by hand, and get told what is wrong with it.

    from attention_ref.exercises import check, hint
    check("softmax_backward", my_softmax_backward)   # prints PASS, or the mistake by name

From the command line: ``python -m attention_ref exercise list | start NAME [PATH] |
hint NAME [N] | check PATH``, and spot-the-bug: ``exercise bug list | start NAME | check PATH``
(:mod:`.bugs`). ``docs/exercises.md`` says what the checker says and how often it is right.
"""
# the exercises: formula, hints, inputs, and the library's forward/backward as the solution
from .catalogue import EXERCISES, Case, Exercise

# checking an attempt, and the classic mistakes it can name
from .checker import CheckResult, check, hint
from .mistakes import MISTAKES, Mistake

# spot the bug: backwards with one realistic mistake each
from .bugs import BUGS, Bug

__all__ = ["EXERCISES", "Case", "Exercise", "CheckResult", "check", "hint", "MISTAKES", "Mistake", "BUGS", "Bug"]
