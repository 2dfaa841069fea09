"""``python -m attention_ref``: the step-by-step walkthrough (see :mod:`attention_ref.walkthrough`)."""
import sys

from .walkthrough import main

sys.exit(main())
