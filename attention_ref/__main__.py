"""``python -m attention_ref``: the step-by-step walkthrough (see :mod:`attention_ref.documents.walkthrough`)."""
import os
import sys

from .documents.walkthrough import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:  # output piped into `head` or a pager that quit early
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 0
sys.exit(code)
