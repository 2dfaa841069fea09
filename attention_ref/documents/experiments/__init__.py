"""The experiments that decide the documents' checkable claims, one module per question:
what scores can do (:mod:`.scores`), what attention costs (:mod:`.cost`), and which two
computations must agree (:mod:`.equivalences`)."""
from .scores import *  # noqa: F401,F403
from .scores import __all__ as _scores
from .cost import *  # noqa: F401,F403
from .cost import __all__ as _cost
from .equivalences import *  # noqa: F401,F403
from .equivalences import __all__ as _equivalences
from .scores import HULL_TIE_TOL, _beats  # noqa: F401  (the tie rule, used by notebook 06 and tests)

__all__ = _scores + _cost + _equivalences
