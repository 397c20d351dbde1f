"""``python -m hardbatch_experiments.recipes.simcse``: the same as ``hardbatch bench simcse``."""

import sys

from .cli import main

sys.exit(main())
