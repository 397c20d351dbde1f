"""The memory a build may take: the host's available memory, capped by a cgroup limit."""

from __future__ import annotations

import pytest

from hardbatch import _memory


def _files(tmp_path, version, limit, usage, inactive):
    names = {2: ("memory.max", "memory.current", "memory.stat", "inactive_file"),
             1: ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat",
                 "total_inactive_file")}[version]
    folder = tmp_path / f"v{version}"
    folder.mkdir()
    (folder / names[0]).write_text(f"{limit}\n")
    (folder / names[1]).write_text(f"{usage}\n")
    (folder / names[2]).write_text(f"anon 1\n{names[3]} {inactive}\nfile 9\n")
    return (str(folder / names[0]), str(folder / names[1]), str(folder / names[2]), names[3])


@pytest.mark.parametrize("version", [1, 2])
def test_a_cgroup_limit_caps_the_available_memory(tmp_path, monkeypatch, version):
    """Under Docker / Kubernetes / Slurm limits /proc/meminfo shows the host: the check passed
    and the build was OOM-killed instead of getting its ValueError."""
    gib = _memory.GIB
    monkeypatch.setattr(_memory, "CGROUP_FILES", (_files(tmp_path, version, 4 * gib, 3 * gib,
                                                         gib // 2),))
    assert _memory.cgroup_headroom() == 4 * gib - (3 * gib - gib // 2)  # 1.5 GiB
    monkeypatch.setattr(_memory, "_host_available", lambda: 100 * gib)
    assert _memory.available_bytes() == int(1.5 * gib)
    with pytest.raises(ValueError, match=r"needs about 2.00 GiB beyond its input but 1.50 GiB "
                                         r"is available"):
        _memory.check_memory(2 * gib, n=10, d=2, what="a build", reduce="cells=")
    monkeypatch.setattr(_memory, "_host_available", lambda: gib)
    assert _memory.available_bytes() == gib  # the smaller of the two


@pytest.mark.parametrize("limit", ["max", str(2 ** 63 - 4096)])
def test_no_cgroup_limit_leaves_the_host_figure(tmp_path, monkeypatch, limit):
    monkeypatch.setattr(_memory, "CGROUP_FILES", (_files(tmp_path, 2, limit, 5, 0),
                                                  ("/nonexistent/a", "/nonexistent/b",
                                                   "/nonexistent/c", "x")))
    assert _memory.cgroup_headroom() is None
    monkeypatch.setattr(_memory, "_host_available", lambda: 123)
    assert _memory.available_bytes() == 123
