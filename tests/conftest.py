"""The tests mirror the package's layers (core/, variants/, nn/, documents/, plot/); the
cross-cutting ones (gradcheck, the input contract, notebooks, README, packaging, scripts)
sit here. The shared helpers (_helpers.py, _reference.py) live here too, importable from
every subfolder."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
