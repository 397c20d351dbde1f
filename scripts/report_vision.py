#!/usr/bin/env python3
"""Build the vision results page: `hardbatch_experiments.reports.vision`, same options
(``--out PAGE``, default out/reports/vision.md; ``--in-place`` for docs/results/vision.md)."""

from hardbatch_experiments.reports.vision import main

if __name__ == "__main__":
    raise SystemExit(main())
