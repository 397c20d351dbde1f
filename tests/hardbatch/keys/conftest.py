"""The ``hardbatch.keys`` tests' helpers are in ``keys_support.py`` (next to this file, put on
``sys.path`` here: under ``--import-mode=importlib`` a test module cannot import its neighbours
otherwise)."""

import sys
from pathlib import Path

if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))
