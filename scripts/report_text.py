#!/usr/bin/env python3
"""Build the text results page: `hardbatch_experiments.reports.text`, same options
(``--out PAGE``, default out/reports/text.md; ``--in-place`` for docs/results/text.md)."""

from hardbatch_experiments.reports.text import main

if __name__ == "__main__":
    raise SystemExit(main())
