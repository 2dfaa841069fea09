"""The spot-the-bug backwards, one file each, each with one bug on purpose.

They are ordinary Python files, so a linter and a formatter see them; ``attention_ref.exercises.bugs``
reads each one's text (everything after its imports) as the :class:`~attention_ref.exercises.bugs.Bug`'s
source, and ``python -m attention_ref exercise bug start NAME`` writes it to a student's file.
"""
