#!/usr/bin/env python3
"""Fill the tables (and draw the figures) of docs/results/graphs.md from results/graphs/:
`hardbatch_experiments.reports.graphs` (`--in-place` rewrites the page, else
out/reports/graphs.md)."""

from hardbatch_experiments.reports.graphs import main

if __name__ == "__main__":
    raise SystemExit(main())
