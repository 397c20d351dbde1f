#!/usr/bin/env python3
"""Build docs/results/text.md: `hardbatch_experiments.reports.text`, same options."""

from hardbatch_experiments.reports.text import main

if __name__ == "__main__":
    raise SystemExit(main())
