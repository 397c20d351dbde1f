"""``python -m hardbatch_experiments.recipes.codesearch``: the same as ``hardbatch bench
codesearch``."""

import sys

from .cli import main

sys.exit(main())
