"""End-to-end recipes (benchmarks reproducing papers' tables) built on hardbatch's samplers."""

__all__ = ["graphcl", "tu"]
