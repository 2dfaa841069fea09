"""The tests mirror the package's layers (core/, variants/, nn/, documents/, plot/); the
cross-cutting ones (gradcheck, the input contract, notebooks, README, packaging, scripts)
sit here. The shared helpers (_helpers.py, _reference.py) live here too, importable from
every subfolder."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

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
