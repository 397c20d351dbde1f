#!/usr/bin/env python3
"""Fill the tables (and draw the figures) of docs/results/vision.md from results/vision/:
`hardbatch_experiments.reports.vision` (`--in-place` rewrites the page, else
out/reports/vision.md)."""

from hardbatch_experiments.reports.vision import main

if __name__ == "__main__":
    raise SystemExit(main())
