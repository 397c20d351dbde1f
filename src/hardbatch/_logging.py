"""Logging and progress bars of the library's builds (graphs, kNN tables, GCBS orders).

Public names of a private module, shared by :mod:`hardbatch.neighbors.knn_graph` and :mod:`hardbatch.batching.gcbs`.

Logging: every module logs under the ``"hardbatch"`` logger (``hardbatch.neighbors.knn_graph``,
``hardbatch.batching.gcbs``, ...), which carries a ``NullHandler``: nothing is printed unless the
application configures logging, e.g. ``logging.basicConfig(level=logging.INFO)``. Each build
writes one INFO record (:class:`BuildLog`) whose message and attributes give ``build``, ``n``,
``d``, ``method``, ``seconds`` and ``peak_extra_bytes`` (plus build-specific fields).

Peak extra memory is counted, not sampled: each build reports, at each of its steps, the bytes
of the arrays it holds at once (a similarity block and its masks, the quantile sample, pair
lists, the sparse pattern, the output), and the log keeps the largest such sum. It excludes the
input embeddings, allocator slack and the temporaries inside library calls (scipy's RCM, torch's
top-k), so it is a lower bound of the extra resident memory, exact for the arrays the build
allocates itself. ``rss_growth_bytes`` is the growth of the process's peak resident set size
(``resource.getrusage``; Linux kilobytes) during the build: the memory the build added beyond
anything the process had held before (0 when it stayed below an earlier peak).

Progress: ``progress=True`` shows a tqdm bar over the build's blocks on stderr, ``False`` never,
``None`` (the default) when stderr is a terminal. The bar appears only once a build has run
``PROGRESS_DELAY_S`` seconds (tqdm's ``delay``), so builds expected to take a few seconds at most
print nothing. tqdm is imported when a bar is due (``pip install tqdm``; without it a warning is
given once and the build runs silently).
"""

from __future__ import annotations

import logging
import sys
import time
import warnings

try:  # pragma: no cover - resource is POSIX only
    import resource
except ImportError:  # pragma: no cover
    resource = None

__all__ = ["LOGGER_NAME", "NO_BAR", "PROGRESS_DELAY_S", "BuildLog", "get_logger",
           "progress_bar", "show_progress"]

LOGGER_NAME = "hardbatch"
PROGRESS_DELAY_S = 2.0
logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())
_WARNED: set[str] = set()


def get_logger(name: str) -> logging.Logger:
    """The logger ``hardbatch.<name>`` (``name`` without the package prefix)."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


def show_progress(progress: bool | None) -> bool:
    """Whether to show a bar: ``progress`` itself, or (None) whether stderr is a terminal."""
    if progress is None:
        stream = sys.stderr
        return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
    if progress is True or progress is False:
        return progress
    raise ValueError(f"progress must be True, False or None (a bar when stderr is a terminal), "
                     f"got {progress!r}")


class _NoBar:
    """The stand-in of a bar: ``update`` and ``close`` do nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


NO_BAR = _NoBar()  # default ``bar`` argument of the plans' block loops


def progress_bar(total: int, desc: str, progress: bool | None):
    """A bar over ``total`` blocks with ``update(n)`` and ``close()``, or a silent stand-in."""
    if not show_progress(progress) or total <= 1:
        return NO_BAR
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if "tqdm" not in _WARNED:
            _WARNED.add("tqdm")
            warnings.warn("progress bars need tqdm (pip install tqdm); building silently",
                          stacklevel=3)
        return NO_BAR
    return tqdm(total=total, desc=desc, unit="block", delay=PROGRESS_DELAY_S, leave=False,
                file=sys.stderr)


def _max_rss_bytes() -> int:
    if resource is None:  # pragma: no cover
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class BuildLog:
    """Times one build, tracks its peak extra memory and writes one INFO record at the end.

    Use as ``with BuildLog(logger, "gcbs_permutation", method=m) as log:``, then
    ``log.set(n=N, d=d, ...)`` once the inputs are checked and :meth:`hold` with the bytes
    the build holds at each step. The record's attributes: ``build``, ``n``, ``d``,
    ``method``, ``seconds``, ``peak_extra_bytes``, ``rss_growth_bytes`` and the added fields
    (its message lists them all). Nothing is logged when the build raises.
    """

    def __init__(self, logger: logging.Logger, build: str, **fields) -> None:
        self.logger, self.build = logger, build
        self.fields = {"n": None, "d": None, "method": None, **fields}
        self.peak = 0

    def hold(self, *nbytes: int) -> None:
        """The build holds these arrays (bytes) at once now; the largest sum is the peak."""
        self.peak = max(self.peak, int(sum(nbytes)))

    def set(self, **fields) -> None:
        self.fields.update(fields)

    def __enter__(self):
        self._t0, self._rss0 = time.perf_counter(), _max_rss_bytes()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self.logger.isEnabledFor(logging.INFO):
            return
        seconds = time.perf_counter() - self._t0
        growth = max(0, _max_rss_bytes() - self._rss0)
        extra = {"build": self.build, **self.fields, "seconds": seconds,
                 "peak_extra_bytes": self.peak, "rss_growth_bytes": growth}
        f = self.fields
        detail = "".join(f" {k}={v}" for k, v in f.items() if k not in ("n", "d", "method"))
        self.logger.info("%s: N=%s d=%s method=%s%s seconds=%.3f peak_extra_mb=%.1f "
                         "rss_growth_mb=%.1f", self.build, f["n"], f["d"], f["method"], detail,
                         seconds, self.peak / 2**20, growth / 2**20, extra=extra)
