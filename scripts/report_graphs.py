#!/usr/bin/env python3
"""Build docs/results/graphs.md: `hardbatch_experiments.reports.graphs`, same options."""

from hardbatch_experiments.reports.graphs import main

if __name__ == "__main__":
    raise SystemExit(main())
