"""Moved to :mod:`kvcm.models` (test and benchmark support, not the engine); this name stays for older imports."""

from kvcm.models import *  # noqa: F401,F403
from kvcm.models import __all__  # noqa: F401
