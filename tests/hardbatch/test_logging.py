"""Build logging and progress bars (hardbatch._logging): INFO records, silence by default."""

import logging
import subprocess
import sys

import numpy as np
import pytest
from support import unit_rows

import hardbatch as hb
from hardbatch import _logging

BUILDS = {
    "gcbs_permutation": ("hardbatch.batching.gcbs", lambda x, **kw: hb.gcbs_permutation(x, 0.99, **kw)),
    "knn_graph": ("hardbatch.neighbors", lambda x, **kw: hb.knn_graph(x, 5, **kw)),
    "proximity_graph": ("hardbatch.neighbors", lambda x, **kw: hb.proximity_graph(x, 50, 5, **kw)),
}


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_each_build_logs_n_d_method_seconds_memory(rng, caplog, build):
    logger, fn = BUILDS[build]
    x = unit_rows(rng, 300, 6)
    with caplog.at_level(logging.INFO, logger="hardbatch"):
        out = fn(x, progress=False)
    records = [r for r in caplog.records if getattr(r, "build", None) == build]
    assert len(records) == 1
    rec = records[0]
    assert rec.name == logger and rec.levelno == logging.INFO
    assert (rec.n, rec.d) == (300, 6)
    assert rec.method == {"gcbs_permutation": "exact", "knn_graph": "exact",
                          "proximity_graph": "proximity"}[build]
    assert 0 < rec.seconds < 600
    # the output is among the arrays held at once (graphs: the [N, K] table)
    assert rec.peak_extra_bytes >= out.numel() * out.element_size()
    msg = rec.getMessage()
    for part in (f"{build}: N=300 d=6 method={rec.method}", "seconds=", "peak_extra_mb="):
        assert part in msg


def test_gcbs_record_names_resolved_method_and_partners(rng, caplog, monkeypatch):
    monkeypatch.setattr(hb.batching.gcbs.pairs, "AUTO_EXACT_MAX_ITEMS", 100)
    x = unit_rows(rng, 300, 6)
    with caplog.at_level(logging.INFO, logger="hardbatch.batching.gcbs"):
        hb.gcbs_permutation(x, 0.99, min_partners=3)
    (rec,) = caplog.records
    assert rec.method == "ivf" and rec.min_partners == 3 and rec.quantile == 0.99
    assert rec.pairs > 0 and "pairs=" in rec.getMessage()


def test_failed_build_logs_nothing(rng, caplog):
    with caplog.at_level(logging.INFO, logger="hardbatch"):
        with pytest.raises(ValueError):
            hb.knn_graph(unit_rows(rng, 10, 3), 10)
    assert not caplog.records


def test_build_log_keeps_the_largest_sum_held():
    log = _logging.BuildLog(logging.getLogger("hardbatch.test"), "x", n=1, d=1, method="m")
    log.hold(10, 20)
    log.hold(25)
    log.hold(5, 5, 5)
    assert log.peak == 30


@pytest.mark.parametrize("build", sorted(BUILDS))
def test_progress_false_prints_nothing_and_true_shows_a_bar(rng, capfd, monkeypatch, build):
    pytest.importorskip("tqdm")
    monkeypatch.setattr(_logging, "PROGRESS_DELAY_S", 0.0)
    # small blocks, so that these small builds have several
    monkeypatch.setattr(hb.neighbors.knn_graph, "block_elements", lambda device: 20_000)
    monkeypatch.setattr(hb.neighbors.proximity_graph, "block_elements", lambda device: 20_000)
    monkeypatch.setattr(hb.batching.gcbs.pairs, "block_elements", lambda device: 5_000)
    x = unit_rows(rng, 1200, 6)
    fn = BUILDS[build][1]
    fn(x, progress=False)
    assert capfd.readouterr() == ("", "")
    fn(x, progress=True)
    out, err = capfd.readouterr()
    assert out == "" and "block/s" in err and "/" in err


def test_progress_default_is_silent_off_a_terminal(rng, capfd, monkeypatch):
    monkeypatch.setattr(_logging, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(hb.batching.gcbs.pairs, "block_elements", lambda device: 5_000)
    assert not _logging.show_progress(None)  # pytest captures stderr: not a terminal
    hb.gcbs_permutation(unit_rows(rng, 1200, 6), 0.99)
    assert capfd.readouterr() == ("", "")


def test_progress_default_follows_the_terminal(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert _logging.show_progress(None)
    with pytest.raises(ValueError, match="progress must be True, False or None"):
        _logging.show_progress(1)


def test_nothing_printed_without_logging_configuration():
    code = ("import numpy as np, hardbatch as hb\n"
            "x = np.random.default_rng(0).standard_normal((200, 4)).astype(np.float32)\n"
            "hb.gcbs_permutation(x); hb.knn_graph(x, 5)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True)
    assert (res.stdout, res.stderr) == ("", "")


def test_logger_hierarchy():
    assert _logging.get_logger("gcbs").parent is logging.getLogger("hardbatch")
    assert any(isinstance(h, logging.NullHandler)
               for h in logging.getLogger("hardbatch").handlers)
    assert np.isfinite(_logging.PROGRESS_DELAY_S)


@pytest.mark.parametrize("make", [
    lambda x: hb.ProximityGraphSampler(x, 16, 200, 10, refresh_every=None, progress=True),
    lambda x: hb.ProximityGraphSampler(x, 16, 200, 10, graph="knn", refresh_every=None,
                                       progress=True),
    lambda x: hb.GCBSSampler(x, 16, 0.99, method="exact", progress=True),
], ids=["proximity", "knn-graph", "gcbs"])
def test_samplers_pass_progress_to_their_builds(rng, capfd, monkeypatch, make):
    pytest.importorskip("tqdm")
    monkeypatch.setattr(_logging, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setattr(hb.neighbors.knn_graph, "block_elements", lambda device: 20_000)
    monkeypatch.setattr(hb.neighbors.proximity_graph, "block_elements", lambda device: 20_000)
    monkeypatch.setattr(hb.batching.gcbs.pairs, "block_elements", lambda device: 5_000)
    next(iter(make(unit_rows(rng, 1200, 6))))
    out, err = capfd.readouterr()
    assert out == "" and "block/s" in err
    sampler = make(unit_rows(rng, 1200, 6))
    sampler.builder.progress = False  # the build's bar: the builder's setting
    next(iter(sampler))
    assert capfd.readouterr() == ("", "")


def test_sampler_progress_is_checked_at_construction(rng):
    x = unit_rows(rng, 300, 6)
    with pytest.raises(ValueError, match="progress must be True, False or None"):
        hb.GCBSSampler(x, 16, progress="yes")
    with pytest.raises(ValueError, match="progress must be True, False or None"):
        hb.ProximityGraphSampler(x, 16, 100, 10, progress=1)
