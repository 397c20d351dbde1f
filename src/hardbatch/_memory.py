"""The memory a build may take, checked before it allocates (the scalable partition builds).

Public names of a private module, shared by :mod:`hardbatch.neighbors.kmeans_tree`,
:mod:`hardbatch.batching.local_communities` and the cluster and community samplers:

* :func:`available_bytes`: the memory this process may still take: the kernel's
  ``MemAvailable`` (``/proc/meminfo``: free memory plus the caches it can drop), else
  ``os.sysconf`` free pages, else None (unknown: no check); under a cgroup memory limit
  (Docker, Kubernetes, Slurm) at most the limit's headroom;
* :func:`check_memory`: ``ValueError`` when a build's estimate of the memory it adds (beyond the
  input it was given) exceeds ``memory_limit`` (bytes; None: :func:`available_bytes`), naming
  N, d, the estimate, what is available and the option that reduces it. The estimates are the
  arrays a build holds at its peak (documented where they are made), a lower bound of what it
  adds to the resident set; a build whose estimate passes may still run short when other
  processes take memory meanwhile.
"""

from __future__ import annotations

import os

__all__ = ["GIB", "available_bytes", "cgroup_headroom", "check_memory"]

GIB = 1 << 30
#: cgroup v2, then v1: (limit, usage, stat) files of this process's memory controller.
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
                 "/sys/fs/cgroup/memory.stat", "inactive_file"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                 "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                 "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"))


def cgroup_headroom() -> int | None:
    """Bytes left under this process's cgroup memory limit: the limit minus the usage, the
    usage without the inactive file cache the kernel reclaims first (as ``docker stats``
    counts it); None without a limit (or without cgroups)."""
    for limit_file, usage_file, stat_file, inactive_key in CGROUP_FILES:
        try:
            with open(limit_file) as f:
                raw = f.read().strip()
            if raw == "max" or int(raw) >= 1 << 60:  # v2 "max"; v1 "unlimited" is ~2^63
                continue
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        inactive = 0
        try:
            with open(stat_file) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == inactive_key:
                        inactive = int(value)
        except (OSError, ValueError):
            pass
        return max(int(raw) - max(usage - inactive, 0), 0)
    return None


def available_bytes() -> int | None:
    """Bytes the process may still allocate without swapping: ``MemAvailable`` of
    ``/proc/meminfo`` (Linux), else free pages times the page size, else None; at most
    :func:`cgroup_headroom` under a cgroup memory limit.

    Example:
        >>> from hardbatch._memory import available_bytes
        >>> free = available_bytes()
        >>> free is None or free > 0
        True
    """
    host = _host_available()
    cap = cgroup_headroom()
    return cap if host is None else host if cap is None else min(host, cap)


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def check_memory(estimate: int, *, n: int, d: int, what: str, reduce: str,
                 memory_limit: int | None = None) -> None:
    """``ValueError`` when ``estimate`` bytes exceed ``memory_limit`` (None: what
    :func:`available_bytes` reports now; unknown: no check).

    Args:
        estimate: bytes the build would add beyond its input.
        n, d: the items and dimensions, named in the message.
        what: the build (e.g. ``"CommunityBatchSampler's global build"``).
        reduce: the option(s) that reduce the estimate, named in the message.
        memory_limit: bytes the build may take (None: the available memory).

    Example:
        >>> from hardbatch._memory import check_memory
        >>> check_memory(10, n=4, d=2, what="a build", reduce="none", memory_limit=100)
        >>> try:
        ...     check_memory(3 << 30, n=10**7, d=128, what="a build", reduce="cells=",
        ...                  memory_limit=1 << 30)
        ... except ValueError as err:
        ...     print(str(err).split(";")[0])
        a build at N=10000000, d=128 needs about 3.00 GiB beyond its input but 1.00 GiB is available
    """
    limit = available_bytes() if memory_limit is None else int(memory_limit)
    if limit is None or estimate <= limit:
        return
    raise ValueError(f"{what} at N={n}, d={d} needs about {estimate / GIB:.2f} GiB beyond its "
                     f"input but {limit / GIB:.2f} GiB is available; nothing was allocated. "
                     f"Reduce it with {reduce}")
