#!/usr/bin/env python3
"""Fill the tables (and draw the figures) of docs/results/text.md from results/text/:
`hardbatch_experiments.reports.text` (`--in-place` rewrites the page, else
out/reports/text.md)."""

from hardbatch_experiments.reports.text import main

if __name__ == "__main__":
    raise SystemExit(main())
