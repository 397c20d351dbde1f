"""Real-data statistics: the BatchSampler paper's Fig. 4 ordering on MNIST (64 PCA dims, B=512).

Measured with these seeds: false-negative rate uniform 0.10, proximity-graph RWR (alpha 0.2)
0.17, kNN sampler 0.76; hardness (mean top-1 negative cosine) 0.73 < 0.77 < 0.90.
"""

import itertools

import numpy as np
import pytest

import hardbatch as hb
from hardbatch.metrics import batch_false_negative_rate, batch_hardness

pytestmark = pytest.mark.slow  # statistical, on real data: `pytest -m "not slow"` skips it


@pytest.fixture(scope="module")
def batch_statistics(mnist_pca):
    x, labels = mnist_pca
    samplers = {
        "uniform": hb.UniformBatchSampler(len(x), 512, seed=0),
        "rwr": hb.ProximityGraphSampler(x, 512, candidates=1000, neighbors=100, restart=0.2,
                                        seed=0),
        "knn": hb.KNNBatchSampler(x, 512, seed=0),
    }
    stats = {}
    for name, sampler in samplers.items():
        batches = list(itertools.islice(sampler, 20))
        stats[name] = (np.mean([batch_false_negative_rate(labels, b) for b in batches]),
                       np.mean([batch_hardness(x, b) for b in batches]))
    return stats


def test_false_negative_rate_orders_uniform_rwr_knn(batch_statistics):
    fn = {k: v[0] for k, v in batch_statistics.items()}
    assert fn["uniform"] < fn["rwr"] < fn["knn"]
    assert fn["uniform"] == pytest.approx(0.10, abs=0.01)  # 10 balanced classes
    assert 0.12 < fn["rwr"] < 0.30
    assert fn["knn"] > 0.5


def test_hardness_orders_uniform_rwr_knn(batch_statistics):
    hard = {k: v[1] for k, v in batch_statistics.items()}
    assert hard["uniform"] + 0.02 < hard["rwr"] < hard["knn"] - 0.05


def test_restart_trades_hardness_for_false_negatives(mnist_pca):
    # Paper Fig. 5: larger alpha samples more locally -> more false negatives.
    x, labels = mnist_pca
    x, labels = x[:20000], labels[:20000]
    fn = []
    for alpha in (0.05, 0.7):
        s = hb.ProximityGraphSampler(x, 256, 1000, 100, restart=alpha, seed=1)
        fn.append(np.mean([batch_false_negative_rate(labels, b)
                           for b in itertools.islice(s, 10)]))
    assert fn[0] < fn[1]
