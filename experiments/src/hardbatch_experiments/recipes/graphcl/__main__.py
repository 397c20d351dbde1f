"""``python -m hardbatch_experiments.recipes.graphcl``: the same as ``hardbatch bench graphcl``."""

import sys

from .cli import main

sys.exit(main())
