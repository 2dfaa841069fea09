"""The tests mirror the package's layers (core/, variants/, nn/, documents/, plot/); the
cross-cutting ones (gradcheck, the input contract, notebooks, README, packaging, scripts)
sit here. The shared helpers (_helpers.py, _reference.py) live here too, importable from
every subfolder."""
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# A runner that starts the suite in the background of a non-interactive shell (`bash .ci/run &`)
# hands it SIGINT ignored, and every process it starts inherits that: Ctrl-C would then do nothing,
# and the tests that send SIGINT to a script or a child (test_faults, test_child_processes) would
# fail for the runner's reason. Python's own handler here makes the children start as from a
# terminal (a handled signal is reset to its default across exec; an ignored one is not).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Property-based tests (hypothesis): few examples by default, so the suite keeps its time
# budget; derandomized (the same examples on every machine and run) and with no example
# database (nothing written into the checkout). Run them longer with
#   HYPOTHESIS_PROFILE=long python -m pytest tests -k properties
try:
    from hypothesis import settings
except ImportError:  # the test extra installs it; without it the property tests are skipped
    settings = None
if settings is not None:
    import os

    settings.register_profile("ci", max_examples=25, deadline=None, database=None, derandomize=True)
    settings.register_profile("long", max_examples=2000, deadline=None, database=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
