"""One METIS k-way run of a sparse graph (``pymetis``): canonical input, a fixed seed, options
kept in METIS's working range, and METIS's console output caught.

* :func:`require_metis`: the ``pymetis`` module, or an ``ImportError`` naming the extra;
* :func:`check_imbalance`: the balance tolerance, rejected outside ``[1, 2]``;
* :func:`metis_parts`: the labels of one run, inside :func:`metis_output_caught`. METIS (C)
  prints its errors (e.g. "***Cannot bisect a graph with 0 vertices!") to the process's
  standard output, file descriptor 1, not through Python: the runs go with fd 1 redirected to
  a temporary file, and what METIS wrote becomes one :class:`MetisOutputWarning` (anything
  else written to fd 1 meanwhile, e.g. by another thread, is written back to the real
  standard output afterwards).

METIS is chaotic in its input graph: one edge more or less moves every part. Its input here is
canonical (vertices in item order, each adjacency sorted, no self-loops) and its seed fixed, so
equal graphs give equal parts; unequal graphs (e.g. kNN ranks swapped by rounding noise at a
window's end) do not. :func:`hardbatch.batching.communities.community_labels` confines that chaos to cells.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import tempfile
import threading
import warnings
from contextlib import contextmanager

import numpy as np
from scipy.sparse import csr_matrix

from .._validation import check_real

__all__ = ["IMBALANCE_RANGE", "METIS_EXTRA", "MetisOutputWarning", "check_imbalance",
           "metis_output_caught", "metis_parts", "require_metis"]

METIS_EXTRA = "pip install 'hardbatch[metis]'"
#: METIS's balance tolerance (``ufactor = 1000 (imbalance - 1)``) where it behaves: above 2 it
#: leaves parts empty; from about 4 (tiny parts) and always from 7 it prints "***Cannot bisect
#: a graph with 0 vertices!" / "***You are trying to partition a graph into too many parts!".
IMBALANCE_RANGE = (1.0, 2.0)
_FD_LOCK = threading.Lock()  # one redirection of fd 1 at a time
_DEPTH = threading.local()  # .on: this thread's fd 1 is being caught


class MetisOutputWarning(RuntimeWarning):
    """METIS wrote to the console during a run (its lines are in the message).

    Example:
        >>> import warnings
        >>> from hardbatch.batching.metis_partition import MetisOutputWarning
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", MetisOutputWarning)  # e.g. to fail on it
        ...     try:
        ...         warnings.warn(MetisOutputWarning("METIS printed 1 line(s) (caught): ..."))
        ...     except MetisOutputWarning as err:
        ...         print(type(err).__name__, issubclass(type(err), RuntimeWarning))
        MetisOutputWarning True
    """


def require_metis():
    """The ``pymetis`` module, or an ``ImportError`` naming the extra and the fallback.

    Example:
        >>> from hardbatch.batching.metis_partition import require_metis
        >>> require_metis().__name__
        'pymetis'
    """
    try:
        return importlib.import_module("pymetis")
    except ImportError:
        raise ImportError(f"partitioner='metis' needs pymetis; {METIS_EXTRA}, or pass "
                          "partitioner='kmeans' (spherical k-means of the embeddings, no "
                          "extra needed)") from None


def check_imbalance(imbalance) -> float:
    """``imbalance`` as a float in :data:`IMBALANCE_RANGE`, else a ``ValueError`` naming it.

    Example:
        >>> from hardbatch.batching.metis_partition import check_imbalance
        >>> check_imbalance(1.03)
        1.03
        >>> try:
        ...     check_imbalance(100.0)
        ... except ValueError as err:
        ...     print(str(err).split(":")[0])
        imbalance=100.0 is outside METIS's working range [1, 2]
    """
    value = check_real(imbalance, "imbalance", "a number in [1, 2] (e.g. 1.03)")
    low, high = IMBALANCE_RANGE
    if not low <= value <= high:
        raise ValueError(
            f"imbalance={imbalance} is outside METIS's working range [{low:g}, {high:g}]: it is "
            "the largest community over the average (METIS's ufactor); below 1 is impossible, "
            "above 2 METIS leaves communities empty and prints errors ('***Cannot bisect a "
            "graph with 0 vertices!'); use e.g. 1.03 (the default), or partitioner='kmeans' for "
            "groups of any size")
    return value


def _flush_c_stdout() -> None:
    try:
        ctypes.CDLL(None).fflush(None)  # C's buffered stdout (full buffering on a file or pipe)
    except (OSError, AttributeError, TypeError):  # no C library to ask (e.g. Windows)
        pass


@contextmanager
def metis_output_caught():
    """Runs the block with fd 1 sent to a temporary file: METIS's lines of what was written
    become one :class:`MetisOutputWarning`, the rest goes back to the real standard output
    (late). One redirection at a time (a lock); nested in one thread: the outer one catches.
    Without a usable fd 1 the block runs as is.

    Example:
        >>> import warnings
        >>> from hardbatch.batching.metis_partition import metis_output_caught
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     with metis_output_caught():
        ...         pass  # e.g. several METIS runs
        >>> seen
        []
    """
    if getattr(_DEPTH, "on", False):
        yield
        return
    with _FD_LOCK:
        try:
            sys.stdout.flush()
            _flush_c_stdout()
            saved = os.dup(1)
        except (OSError, ValueError, AttributeError):
            saved = None
        if saved is None:
            yield
            return
        _DEPTH.on = True
        try:
            with tempfile.TemporaryFile() as tmp:
                os.dup2(tmp.fileno(), 1)
                try:
                    yield
                finally:
                    _flush_c_stdout()
                    os.dup2(saved, 1)
                    tmp.seek(0)
                    _report(tmp.read().decode("utf-8", "replace"))
        finally:
            _DEPTH.on = False
            os.close(saved)


def _report(text: str) -> None:
    """METIS's lines of ``text`` as one warning; the rest back to the real standard output."""
    lines = text.splitlines(keepends=True)
    ours = [ln.strip() for ln in lines if ln.lstrip().startswith("***")]
    rest = "".join(ln for ln in lines if not ln.lstrip().startswith("***"))
    if rest:
        os.write(1, rest.encode())
    if ours:
        shown = sorted(set(ours), key=ours.index)
        warnings.warn(MetisOutputWarning(
            f"METIS printed {len(ours)} line(s) (caught): {' | '.join(shown)}; the parts are "
            "still valid, but METIS ran outside its working range (fewer items than parts, or "
            "a large imbalance): check the graph and the number of parts"), stacklevel=4)


def metis_parts(graph: csr_matrix, parts: int, *, seed: int = 0,
                imbalance: float = 1.03) -> np.ndarray:
    """METIS k-way labels of the symmetric sparse ``graph`` in ``parts`` parts.

    The input is canonical (CSR with sorted indices, vertices in row order), the seed fixed
    (``seed & 0x7FFFFFFF``) and ``ufactor = round(1000 (imbalance - 1))`` (at least 1;
    ``imbalance`` checked by :func:`check_imbalance`). METIS's console output becomes one
    :class:`MetisOutputWarning`.

    Returns:
        int64 ``[N]`` labels in ``[0, parts)`` (a part may be empty).

    Example:
        >>> import numpy as np
        >>> from scipy.sparse import csr_matrix
        >>> from hardbatch.batching.metis_partition import metis_parts
        >>> ring = csr_matrix((np.ones(16), (np.arange(16) % 8, (np.arange(16) + np.repeat(
        ...     [1, 7], 8)) % 8)), shape=(8, 8))  # a ring of 8 items
        >>> labels = metis_parts(ring, 2)
        >>> np.bincount(labels).tolist(), len(set(labels[:4].tolist()))  # two arcs of 4
        ([4, 4], 1)
    """
    n = graph.shape[0]
    ufactor = max(1, round((check_imbalance(imbalance) - 1.0) * 1000))
    if parts <= 1 or n <= 1:
        return np.zeros(n, np.int64)
    metis = require_metis()
    g = csr_matrix(graph)
    g.sort_indices()
    options = metis.Options(seed=int(seed & 0x7FFFFFFF), ufactor=ufactor)
    ptr, adj = g.indptr.astype(np.int64), g.indices.astype(np.int64)
    with metis_output_caught():
        if hasattr(metis, "CSRAdjacency"):  # pymetis >= 2025.2 (xadj= / adjncy= deprecated)
            _, labels = metis.part_graph(parts, metis.CSRAdjacency(ptr, adj), options=options)
        else:
            _, labels = metis.part_graph(parts, xadj=ptr, adjncy=adj, options=options)
    return np.asarray(labels, np.int64)
