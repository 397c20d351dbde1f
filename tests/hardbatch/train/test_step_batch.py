"""hardbatch.train.step_batch: how batches reach a step (tensor data, a dataset through a
DataLoader, a dataset of (index, view1, view2) items), the skip of a one-item batch and the
per-step figures in a reference embedding; and hardbatch.data's IndexedDataset / indexed_batch
that the indexed path relies on."""

import math

import numpy as np
import pytest
import torch
from train_support import SAMPLERS, make_trainer, noise_augment, small_model

import hardbatch as hb
from hardbatch.losses import InfoNCE
from hardbatch.train import TrainConfig, Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- one-item batches


def test_single_item_last_batch_is_skipped_without_update(digits):
    """N % B == 1 leaves a one-item batch: no negative, so no update (as drop_last), flagged."""
    x, y = digits
    x, y = x[:65], y[:65]  # 65 = 2 * 32 + 1
    trainer = Trainer(small_model(), InfoNCE(0.5),
                      lambda bank: hb.UniformBatchSampler(bank.num_items, 32, seed=1), x, y,
                      augment=noise_augment,
                      config=TrainConfig(epochs=2, seed=3, progress=False, eval_every=None))
    sampler_batches = [len(b) for b in trainer.sampler]
    assert sampler_batches == [32, 32, 1]

    def snapshot():
        return [p.detach().clone() for p in trainer.model.parameters()]

    batches = list(trainer.sampler)
    trainer.train_step(batches[0])
    before = snapshot()
    with pytest.warns(UserWarning, match="drop_last=True"):
        record = trainer.train_step(batches[2])
    assert record["skipped"] is True and record["loss"] == 0.0
    assert math.isnan(record["hardness"])
    for a, b in zip(before, snapshot()):
        assert torch.equal(a, b)
    result = trainer.fit()  # a whole run finishes; one skipped step per epoch
    skipped = [r["step"] for r in result.history if r.get("skipped")]
    assert skipped == [3, 6]
    assert all(math.isfinite(r["loss"]) for r in result.history)


# --------------------------------------------------------------------------- inputs


def test_dataset_input_through_dataloader(digits):
    x, y = digits
    dataset = torch.utils.data.TensorDataset(x, y)  # items are (input, label): input is used
    result = Trainer(small_model(), InfoNCE(0.5), SAMPLERS["proximity"], dataset, y,
                     augment=noise_augment, epochs=1, seed=3, progress=False).fit()
    tensor_result = make_trainer(x, y, "proximity", epochs=1).fit()
    assert result.steps == tensor_result.steps
    np.testing.assert_allclose([r["loss"] for r in result.history],
                               [r["loss"] for r in tensor_result.history], rtol=1e-6)


def test_indexed_dataset_yields_index_and_views():
    """issue 17.13: hardbatch.IndexedDataset(dataset, transform, views) -> (index, views...)."""
    from hardbatch.data import IndexedDataset, indexed_batch

    base = torch.utils.data.TensorDataset(torch.arange(10.0).reshape(5, 2), torch.zeros(5))
    calls = []

    def plus_call(x):
        calls.append(1)
        return x + len(calls)

    data = IndexedDataset(base, transform=plus_call)
    i, v1, v2 = data[3]
    assert i == 3 and torch.equal(v1, base[3][0] + 1) and torch.equal(v2, base[3][0] + 2)
    assert len(data) == 5 and len(IndexedDataset(base, views=1)[0]) == 2
    assert IndexedDataset([7, 8], views=3)[1] == (1, 8, 8, 8)
    loader = torch.utils.data.DataLoader(data, batch_sampler=hb.UniformBatchSampler(5, 2, seed=0))
    idx, x1, x2 = indexed_batch(next(iter(loader)))
    assert idx.dtype == torch.int64 and idx.shape == (2,) and x1.shape == x2.shape == (2, 2)
    for bad in ({"views": 0}, {"transform": "flip"}):
        with pytest.raises(ValueError, match="views=0 must be|transform must be callable"):
            IndexedDataset(base, **bad)


def test_a_batch_without_index_is_a_clear_first_error():
    """A loader over a dataset of (view1, view2) pairs: indexed_batch names IndexedDataset."""
    from hardbatch.data import indexed_batch

    pairs = torch.utils.data.TensorDataset(torch.randn(6, 3), torch.randn(6, 3))
    loader = torch.utils.data.DataLoader(pairs, batch_sampler=hb.UniformBatchSampler(6, 3))
    with pytest.raises(ValueError, match=r"first entry is a torch.float32 tensor of shape \[3, 3\]"
                                         r".*hardbatch.IndexedDataset\(dataset, transform\)"):
        indexed_batch(next(iter(loader)))
    with pytest.raises(ValueError, match="no index entry"):
        indexed_batch(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="is not the sampler's ids"):
        indexed_batch((torch.tensor([0, 1]), torch.zeros(2, 3)), ids=[0, 2])
    with pytest.raises(ValueError, match="holds 2 ids but entry 1 has 3 rows"):
        indexed_batch((torch.tensor([0, 1]), torch.zeros(3, 3)))


def test_trainer_uses_the_views_of_an_indexed_dataset(digits):
    """Items (index, view1, view2): the dataset's views are trained on (augment unused); a
    dataset whose items start with their index is used as it is, not as inputs."""
    from hardbatch.data import IndexedDataset

    x, y = digits
    gen = torch.Generator().manual_seed(5)
    data = IndexedDataset(torch.utils.data.TensorDataset(x, y),
                          transform=lambda v: noise_augment(v, gen))

    def no_augment(v, generator=None):
        raise AssertionError("augment must not be called for a dataset's own views")

    result = Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], data, y,
                     augment=no_augment, epochs=1, progress=False).fit()
    assert result.steps == 5 and all(math.isfinite(r["loss"]) for r in result.history)
    own = [(i, x[i], x[i]) for i in range(len(x))]  # a hand-made indexed list
    mine = Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], own, y, augment=no_augment,
                   epochs=1, progress=False)
    assert mine.fit().steps == 5 and mine.bank.step == 5


# --------------------------------------------------------------------------- reference embedding


def test_reference_embedding_measures_every_step_in_fixed_coordinates(digits, tmp_path):
    """issue 22.5: with reference=, each step also logs its batch's figures in the reference,
    which equal the metrics of the step's batch ids in it (same for any model or sampler)."""
    from hardbatch.metrics import batch_hardness, batch_near_duplicate_rate

    x, y = digits
    ref = x[:, :16] + 0.1  # any fixed [N, d'] embedding
    np.save(tmp_path / "ref.npy", ref.numpy())
    for name in ("uniform", "gcbs"):
        trainer = Trainer(small_model(), InfoNCE(0.5), SAMPLERS[name], x, y,
                          augment=noise_augment, epochs=1, progress=False,
                          reference=tmp_path / "ref.npy" if name == "gcbs" else ref)
        result = trainer.fit()
        for record, batch in zip(result.history, result.last_epoch_batches):
            assert record["reference_hardness"] == pytest.approx(batch_hardness(ref, batch))
            assert record["reference_near_duplicate_rate"] == pytest.approx(
                batch_near_duplicate_rate(ref, batch))
            assert record["hardness"] != pytest.approx(record["reference_hardness"])
    via_config = make_trainer(x, y, "uniform", epochs=1, reference=str(tmp_path / "ref.npy"))
    assert "reference_hardness" in via_config.fit().history[0]
    assert "reference_hardness" not in make_trainer(x, y, "uniform", epochs=1).fit().history[0]
    np.save(tmp_path / "short.npy", ref[:10].numpy())
    with pytest.raises(ValueError, match="reference has 10 rows but there are 160 items"):
        make_trainer(x, y, "uniform", reference=str(tmp_path / "short.npy"))
