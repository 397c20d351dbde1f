"""Vision (issue 7): CIFAR-10 loaders, batched SimCLR augmentations, encoders, the GPU path of the
trainer exercised on the CPU (autocast, channels_last) and a tiny ``hardbatch bench simclr`` run."""

from __future__ import annotations

import io
import json
import pickle
import zipfile

import numpy as np
import pytest
import torch

from hardbatch_experiments import vision as V
from hardbatch_experiments.datasets import CIFAR10_CLASSES, DataNotFoundError, load_cifar10

PIL = pytest.importorskip("PIL.Image")


# ------------------------------------------------------------------------------ loaders
def _jpeg(color) -> bytes:
    buf = io.BytesIO()
    PIL.new("RGB", (32, 32), color).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _tiny_zip(path, per_split=None):
    per_split = per_split or {"train": {"cat": 2, "truck": 1}, "test": {"airplane": 1}}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for split, classes in per_split.items():
            zf.writestr(f"{split}/", b"")
            for cls, k in classes.items():
                for i in range(k):
                    zf.writestr(f"{split}/{cls}/{i:04d}.jpg", _jpeg((200, 20 * i, 40)))
    return path


def test_cifar_zip_layout_and_cache(tmp_path):
    root = tmp_path / "data"
    (root / "images" / "cifar10").mkdir(parents=True)
    zpath = _tiny_zip(root / "images" / "cifar10" / "cifar10_jpg.zip")
    cache = tmp_path / "cache"
    x, y = load_cifar10(root, "train", cache_dir=cache)
    assert x.shape == (3, 3, 32, 32) and x.dtype == torch.uint8
    assert y.tolist() == [CIFAR10_CLASSES.index("cat")] * 2 + [CIFAR10_CLASSES.index("truck")]
    assert abs(int(x[0, 0].float().mean()) - 200) <= 3 and abs(int(x[0, 2].float().mean()) - 40) <= 3
    assert len(list(cache.glob("cifar10_uint8_*.npz"))) == 1
    xt, yt = load_cifar10(zpath, "test", cache_dir=cache)  # the zip itself; from the cache
    assert xt.shape == (1, 3, 32, 32) and yt.tolist() == [0]
    x2, _ = load_cifar10(zpath, "train", cache_dir=False)
    assert torch.equal(x, x2)


def test_cifar_pickle_layout(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    expect = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (2, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, 2).tolist()
        expect[name] = (data, labels)
        with open(folder / name, "wb") as fh:
            pickle.dump({b"data": data, b"labels": labels}, fh)
    x, y = load_cifar10(tmp_path, "train")
    assert x.shape == (10, 3, 32, 32) and y.shape == (10,)
    assert np.array_equal(x[0].numpy().reshape(-1), expect["data_batch_1"][0][0])
    _xt, yt = load_cifar10(folder, "test")
    assert yt.tolist() == expect["test_batch"][1]


def test_cifar_errors(tmp_path):
    with pytest.raises(DataNotFoundError, match="HARDBATCH_DATA"):
        load_cifar10(tmp_path, "train")
    with pytest.raises(ValueError, match="split"):
        load_cifar10(tmp_path, "validation")
    bad = tmp_path / "bad.zip"
    _tiny_zip(bad, {"train": {"unicorn": 1}})
    with pytest.raises(ValueError, match="unknown class"):
        load_cifar10(bad, "train", cache_dir=False)


def test_real_cifar_zip_counts(data_root):
    path = data_root / "images" / "cifar10" / "cifar10_jpg.zip"
    if not path.is_file():
        pytest.skip("cifar10_jpg.zip not in the data folder")
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if n.endswith(".jpg")]
    parts = [n.split("/") for n in names]
    assert sum(p[0] == "train" for p in parts) == 50000
    assert sum(p[0] == "test" for p in parts) == 10000
    assert sorted({p[1] for p in parts}) == sorted(CIFAR10_CLASSES)


# ------------------------------------------------------------------------------ augmentations
@pytest.fixture
def images():
    return torch.randint(0, 256, (8, 3, 32, 32), generator=torch.Generator().manual_seed(0),
                         dtype=torch.uint8)


def test_augment_shape_dtype_range_determinism(images):
    aug = V.cifar_augment()
    a = aug(images, torch.Generator().manual_seed(1))
    b = aug(images, torch.Generator().manual_seed(1))
    c = aug(images, torch.Generator().manual_seed(2))
    assert a.shape == images.shape and a.dtype == torch.float32
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    assert torch.equal(a, b) and not torch.equal(a, c)
    m = V.mnist_augment()(images[:, :1, :28, :28], torch.Generator().manual_seed(0))
    assert m.shape == (8, 1, 28, 28) and 0.0 <= float(m.min()) and float(m.max()) <= 1.0


def test_flip_crop_identity_grayscale(images):
    x = V.to_float(images)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(V.random_flip(x, g, p=1.0), x.flip(-1))
    assert torch.equal(V.random_flip(x, g, p=0.0), x)
    crop = V.random_resized_crop(x, g, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert torch.allclose(crop, x, atol=1e-5)
    # scale 1 with a non-square ratio range: torchvision's fallback, the whole image
    crop = V.random_resized_crop(x, g, scale=(1.0, 1.0), ratio=(0.5, 0.9))
    assert torch.allclose(crop, x, atol=1e-5)
    plain = V.SimCLRAugment(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=0.0, jitter_p=0.0,
                            grayscale=0.0)
    assert torch.equal(plain(images, g), x)
    gray = V.random_grayscale(x, g, p=1.0)
    assert torch.equal(gray[:, 0], gray[:, 1]) and torch.equal(gray[:, 1], gray[:, 2])
    assert torch.equal(V.color_jitter(x, g, p=0.0), x)
    jit = V.color_jitter(x, g, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0, p=1.0)
    assert torch.allclose(jit, x, atol=1e-5)  # neutral factors; HSV round trip is exact enough
    crop = V.random_resized_crop(x, g, scale=(0.1, 0.3))
    assert crop.shape == x.shape and not torch.allclose(crop, x)


def test_augment_bad_input(images):
    x = V.to_float(images)
    with pytest.raises(ValueError, match="scale"):
        V.random_resized_crop(x, scale=(0.0, 1.0))
    with pytest.raises(ValueError, match="scale"):
        V.SimCLRAugment(scale=(0.9, 0.2))
    with pytest.raises(ValueError, match="p=1.5"):
        V.random_flip(x, p=1.5)
    with pytest.raises(ValueError, match="x must be a"):
        V.cifar_augment()(x[0])
    with pytest.raises(ValueError, match="brightness"):
        V.color_jitter(x, brightness=2.0)
    with pytest.raises(ValueError, match="RGB"):
        V.random_grayscale(x[:, :1])


# ------------------------------------------------------------------------------ encoders
def test_encoders_shapes():
    x = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    conv = V.make_encoder("convnet", "cifar10")
    assert conv(x).shape == (2, 256) and conv.out_dim == 256
    res = V.make_encoder("resnet18", "cifar10").eval()
    with torch.no_grad():
        assert res(x).shape == (2, 512)
    mn = V.make_encoder("convnet", "mnist")
    assert mn(torch.rand(3, 1, 28, 28)).shape == (3, 256)
    assert V.projection_head(256)(torch.randn(4, 256)).shape == (4, 128)
    with pytest.raises(ValueError, match="arch"):
        V.make_encoder("vit", "cifar10")
    with pytest.raises(ValueError, match="dataset"):
        V.make_encoder("convnet", "imagenet")
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        conv(torch.rand(2, 1, 32, 32))


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_trainer_gpu_path_on_cpu(amp, tmp_path):
    """device / autocast / channels_last / augmentations on the batch's device, run on the CPU."""
    from hardbatch import InfoNCE, UniformBatchSampler
    from hardbatch.train import TrainConfig, Trainer

    torch.manual_seed(0)
    x = torch.randint(0, 256, (32, 3, 16, 16), dtype=torch.uint8)
    y = torch.arange(32) % 4
    enc = V.ConvNet(3, (8, 16))
    wrapped = V.ImageEncoder(enc, V.CIFAR10_MEAN, V.CIFAR10_STD, enc.out_dim)
    cfg = TrainConfig(epochs=1, device="cpu", amp=amp, channels_last=True, progress=False,
                      probe_every_eval=False, eval_every=1, max_steps=2,
                      checkpoint_path=str(tmp_path / "ck.pt"))
    tr = Trainer(wrapped, InfoNCE(0.5), UniformBatchSampler(32, 16), x, y,
                 head=V.projection_head(16, 8), augment=V.cifar_augment(),
                 eval_data=(x[:8], y[:8]), config=cfg)
    res = tr.fit()
    assert res.steps == 2 and all(np.isfinite(r["loss"]) for r in res.history)
    assert "linear_probe_accuracy" not in res.evals[0]
    assert "linear_probe_accuracy" in res.evals[-1]
    assert (tr.scaler is not None) == (amp == "fp16")
    with pytest.raises(ValueError, match="amp"):
        TrainConfig(amp="fp8")


# ------------------------------------------------------------------------------ bench simclr
def test_bench_simclr_tiny_run_and_skip(data_root, tmp_path, capsys):
    from hardbatch.cli import main

    args = ["bench", "simclr", "--dataset", "mnist", "--data-dir", str(data_root),
            "--sampler", "proximity", "--loss", "sscl", "--train-size", "200", "--test-size",
            "100", "--batch-size", "32", "--epochs", "1", "--max-steps", "2", "--eval-every",
            "1", "--candidates", "50", "--neighbors", "10", "--out", str(tmp_path)]
    assert main(args) == 0
    files = list(tmp_path.glob("simclr-mnist__proximity__sscl__seed0__*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    assert rec["steps"] == 2 and 0.0 <= rec["knn_accuracy"] <= 1.0
    assert 0.0 <= rec["linear_probe_accuracy"] <= 1.0
    assert [e["step"] for e in rec["evals"]] == [0, 1, 2]
    assert len(rec["trace"]["false_negative_rate"]) == 2 and rec["images_per_second"] > 0
    assert rec["config"]["train_size"] == 200 and rec["config"]["test_size"] == 100
    # issue 22.5: the batches measured in one fixed reference shared by every arm of the seed
    ref = rec["reference_diagnostics"]
    assert len(rec["trace"]["reference_hardness"]) == 2 and -1 <= ref["mean_hardness"] <= 1
    assert 0 <= ref["mean_near_duplicate_rate"] <= 1 and "untrained network" in ref["embedding"]
    assert ref["mean_hardness"] == pytest.approx(sum(rec["trace"]["reference_hardness"]) / 2)
    assert not list(tmp_path.glob(".*.ckpt")) and not list(tmp_path.glob(".*.lock"))
    mtime = files[0].stat().st_mtime_ns
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1/1 runs done, 0 to run" in out
    assert "[simclr] done: 0 ran, 1 skipped (finished before), 0 failed, 0 missing" in out
    assert files[0].stat().st_mtime_ns == mtime


def test_bench_simclr_bad_input(data_root, tmp_path, capsys):
    from hardbatch.cli import main

    base = ["bench", "simclr", "--dataset", "mnist", "--data-dir", str(data_root), "--out",
            str(tmp_path)]
    assert main(base + ["--sampler", "bogus"]) == 2
    assert "unknown sampler 'bogus'" in capsys.readouterr().err
    assert main(base + ["--neighbors", "600"]) == 2
    assert "--neighbors" in capsys.readouterr().err
    assert main(base + ["--train-size", "100", "--batch-size", "256", "--sampler",
                        "uniform"]) == 2
    assert "batch_size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(base + ["--epochs", "0"])
    assert "positive integer" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.json"))


def test_hue_shift_and_hsv_round_trip():
    red = torch.zeros(1, 3, 2, 2)
    red[:, 0] = 1.0
    # hue +0.5 turn (shift drawn in [-0.5, 0.5] with p=1: check against the drawn value)
    g = torch.Generator().manual_seed(0)
    out = V.color_jitter(red, g, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.5, p=1.0)
    g = torch.Generator().manual_seed(0)
    torch.rand(1, generator=g)  # the apply draw
    for _ in range(3):
        torch.rand(1, generator=g)  # brightness, contrast, saturation factors
    shift = float(torch.rand(1, generator=g) * 1.0 - 0.5)
    h = shift % 1.0
    expect = V._hsv_to_rgb(torch.tensor([h, 1.0, 1.0]).view(1, 3, 1, 1))
    assert torch.allclose(out[0, :, 0, 0], expect[0, :, 0, 0], atol=1e-5)
    x = torch.rand(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(V._hsv_to_rgb(V._rgb_to_hsv(x)), x, atol=1e-5)


def test_throughput_benchmark_script(data_root, tmp_path):
    """benchmarks/bench_simclr.py (the GPU throughput benchmark) runs end to end on the CPU."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_simclr

    out = tmp_path / "simclr.json"
    args = ["--dataset", "mnist", "--data-dir", str(data_root), "--train-size", "300",
            "--batch-size", "32", "--steps", "4", "--warmup", "1", "--refresh-every", "2",
            "--candidates", "50", "--neighbors", "10", "--device", "cpu", "--threads", "1",
            "--samplers", "uniform", "proximity", "--json", str(out)]
    assert bench_simclr.main(args) == 0
    rec = json.loads(out.read_text())
    assert [r["sampler"] for r in rec["results"]] == ["uniform", "proximity"]
    for r in rec["results"]:
        assert r["steps"] == 4 and r["timed_steps"] == 3
        assert r["images_per_second"] > 0 and 0.0 <= r["sampler_share"] < 1.0
    assert rec["config"]["device"] == "cpu" and rec["config"]["train_size"] == 300
    with pytest.raises(SystemExit):
        bench_simclr.main(args[:-2] + ["--steps", "1", "--warmup", "1"])
    with pytest.raises(SystemExit):
        bench_simclr.main(args + ["--warmup", "-1"])
