#!/usr/bin/env python3
"""Build the graphs results page: `hardbatch_experiments.reports.graphs`, same options
(``--out PAGE``, default out/reports/graphs.md; ``--in-place`` for docs/results/graphs.md)."""

from hardbatch_experiments.reports.graphs import main

if __name__ == "__main__":
    raise SystemExit(main())
