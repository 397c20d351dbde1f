#!/usr/bin/env python3
"""Build docs/results/vision.md: `hardbatch_experiments.reports.vision`, same options."""

from hardbatch_experiments.reports.vision import main

if __name__ == "__main__":
    raise SystemExit(main())
