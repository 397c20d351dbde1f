#!/usr/bin/env python3
"""Fill the tables of docs/results/code_search.md from results/code_search/:
`hardbatch_experiments.reports.code_search` (`--in-place` rewrites the page, else
out/reports/code_search.md)."""

from hardbatch_experiments.reports.code_search import main

if __name__ == "__main__":
    raise SystemExit(main())
