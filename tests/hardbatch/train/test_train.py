"""hardbatch.train: the Trainer (steps, resume, data paths) and the evaluation helpers."""

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import hardbatch as hb
from hardbatch.losses import InfoNCE
from hardbatch.metrics import batch_false_negative_rate
from hardbatch.train import TrainConfig, Trainer, knn_accuracy, linear_probe_accuracy, train
from hardbatch_experiments.datasets import load_digits


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits()
    return x[:160], y[:160]


pytestmark = pytest.mark.usefixtures("one_thread")


def noise_augment(x, generator=None):
    return x + 0.05 * torch.randn(x.shape, generator=generator)


def small_model(seed=0, d_in=64, d_out=8):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, 32), nn.ReLU(), nn.Linear(32, d_out))


SAMPLERS = {
    "uniform": lambda bank: hb.UniformBatchSampler(bank.num_items, 32, seed=1),
    "proximity": lambda bank: hb.ProximityGraphSampler(
        bank, 32, candidates=50, neighbors=10, restart=hb.LinearDecay(0.2, 0.05),
        refresh_every=3, epochs=3, seed=1),
    "knn": lambda bank: hb.KNNBatchSampler(bank, 32, refresh_every=4, seed=1),
    "gcbs": lambda bank: hb.GCBSSampler(bank, 32, quantile=0.99, seed=1),
}


def sscl(seed):
    return hb.SSCLLoss(0.5, tau_plus=0.1, beta=1.0, generator=torch.Generator().manual_seed(seed))


def make_trainer(x, y, sampler="proximity", seed=0, loss=None, **config):
    config = {"epochs": 3, "seed": 3, "progress": False, "probe_max_iter": 30, **config}
    return Trainer(small_model(seed), loss or InfoNCE(0.5), SAMPLERS[sampler], x, y,
                   augment=noise_augment, config=TrainConfig(**config))


# --------------------------------------------------------------------------- one step


def test_train_step_feeds_bank_with_anchor_embeddings(digits):
    x, y = digits
    trainer = make_trainer(x, y, "uniform")
    model_before = small_model(0)
    model_before.load_state_dict(trainer.model.state_dict())
    gen = torch.Generator()
    gen.set_state(trainer.generator.get_state())
    batch = list(range(10, 42))
    record = trainer.train_step(batch)
    # the bank holds z1 = model(view 1) of the pre-step weights: no extra forward pass
    with torch.no_grad():
        z1 = model_before(noise_augment(x[batch], gen))
    torch.testing.assert_close(trainer.bank.embeddings[batch], z1)
    assert trainer.bank.step == 1
    assert (trainer.bank.last_update[batch] == 0).all()
    assert (trainer.bank.last_update[:10] == -1).all()
    assert set(record) >= {"step", "epoch", "loss", "hardness", "false_negative_rate",
                           "step_seconds"}
    assert math.isfinite(record["loss"]) and -1 <= record["hardness"] <= 1
    assert record["false_negative_rate"] == pytest.approx(
        batch_false_negative_rate(y, batch))
    # the weights moved
    assert not torch.equal(model_before[0].weight, trainer.model[0].weight)


def test_fit_logs_every_step_refreshes_graph_from_bank(digits, tmp_path):
    x, y = digits
    trainer = make_trainer(x, y, "proximity", log_path=str(tmp_path / "log.jsonl"))
    result = trainer.fit()
    steps = 3 * len(trainer.sampler)
    assert result.steps == steps == len(result.history) and result.epochs == 3
    assert [r["step"] for r in result.history] == list(range(1, steps + 1))
    assert trainer.bank.step == steps and trainer.bank.filled > 0.5  # walks may skip items
    # refresh_every=3 over the whole run: steps 0, 3, 6, ...
    assert trainer.sampler.refreshes == -(-steps // 3)
    assert 0 < result.sampler_seconds < result.step_seconds
    assert all(r["sampler_seconds"] >= 0 for r in result.history)
    assert len(result.last_epoch_batches) == len(trainer.sampler)
    # final evaluation on the held-out share (no eval_data given)
    assert len(result.evals) == 1 and result.evals[0]["step"] == steps
    assert 0 <= result.final["knn_accuracy"] <= 1 and 0 <= result.final["linear_probe_accuracy"] <= 1
    lines = [json.loads(s) for s in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["step"] * steps + ["eval"]
    assert [r["loss"] for r in lines[:-1]] == [r["loss"] for r in result.history]


def test_no_labels_no_eval_and_nan_false_negatives(digits):
    x, _ = digits
    result = Trainer(small_model(), InfoNCE(0.5), SAMPLERS["gcbs"], x, augment=noise_augment,
                     epochs=1, progress=False).fit()
    assert result.evals == [] and result.final == {}
    assert all(math.isnan(r["false_negative_rate"]) for r in result.history)


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


def test_eval_every_and_eval_data(digits):
    x, y = digits
    x_test, y_test = load_digits()
    trainer = Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], x, y,
                      augment=noise_augment, eval_data=(x_test[-100:], y_test[-100:]),
                      config=TrainConfig(epochs=2, eval_every=4, progress=False))
    result = trainer.fit()
    assert [e["step"] for e in result.evals] == [4, 8, 10]  # and at the end
    assert trainer.eval_data[0] is x and trainer.eval_data[2].shape[0] == 100


def test_same_seed_same_run_other_seed_differs(digits):
    x, y = digits
    a = make_trainer(x, y, "knn", epochs=1).fit()
    b = make_trainer(x, y, "knn", epochs=1).fit()
    c = make_trainer(x, y, "knn", epochs=1, seed=4).fit()
    loss = [r["loss"] for r in a.history]
    assert loss == [r["loss"] for r in b.history]
    assert a.last_epoch_batches == b.last_epoch_batches
    assert loss != [r["loss"] for r in c.history]


# --------------------------------------------------------------------------- resume


def _weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("sampler,stop", [("proximity", 7), ("proximity", 10), ("gcbs", 8),
                                          ("knn", 6)])
def test_resume_equals_uninterrupted(digits, tmp_path, sampler, stop):
    """Interrupt after ``stop`` steps, resume from the checkpoint: same weights, losses, batches.

    SSCL draws synthetic negatives from its own generator, so the loss RNG is exercised too.
    """
    x, y = digits
    cfg = {"eval_every": 6}  # 5 steps per epoch, 15 in all: stops mid-epoch and at an epoch end
    full = make_trainer(x, y, sampler, loss=sscl(0), **cfg)
    full_result = full.fit()

    ck, log = tmp_path / "ck.pt", tmp_path / "log.jsonl"
    first = make_trainer(x, y, sampler, loss=sscl(0), max_steps=stop,
                         checkpoint_path=str(ck), log_path=str(log), **cfg)
    partial = first.fit()
    assert partial.steps == stop and partial.stopped_early and ck.is_file()
    # a fresh process would rebuild everything; a different init proves the weights are loaded
    resumed = make_trainer(x, y, sampler, seed=99, loss=sscl(7),
                           checkpoint_path=str(ck), log_path=str(log), **cfg)
    assert resumed.global_step == 0
    result = resumed.fit()

    assert result.steps == full_result.steps and not result.stopped_early
    for key, value in _weights(full).items():
        assert torch.equal(value, _weights(resumed)[key]), key
    assert [r["loss"] for r in result.history] == [r["loss"] for r in full_result.history]
    assert [r["hardness"] for r in result.history] == [r["hardness"] for r in full_result.history]
    assert result.last_epoch_batches == full_result.last_epoch_batches
    assert [(e["step"], e["knn_accuracy"], e["linear_probe_accuracy"]) for e in result.evals] == \
        [(e["step"], e["knn_accuracy"], e["linear_probe_accuracy"]) for e in full_result.evals]
    torch.testing.assert_close(resumed.bank.embeddings, full.bank.embeddings, rtol=0, atol=0)
    logged = [json.loads(s) for s in log.read_text().splitlines()]
    assert [r["loss"] for r in logged if r["kind"] == "step"] == \
        [r["loss"] for r in full_result.history]


def test_checkpoint_every_and_resume_after_finish(digits, tmp_path):
    x, y = digits
    ck = tmp_path / "run" / "ck.pt"
    trainer = make_trainer(x, y, "uniform", epochs=1, checkpoint_path=str(ck), checkpoint_every=2)
    result = trainer.fit()
    state = torch.load(ck, weights_only=False)
    assert state["progress"]["global_step"] == result.steps
    again = make_trainer(x, y, "uniform", epochs=1, checkpoint_path=str(ck)).fit()
    assert again.steps == result.steps and len(again.history) == len(result.history)


def test_bad_checkpoint_is_a_clear_error(digits, tmp_path):
    x, y = digits
    bad = tmp_path / "bad.pt"
    torch.save({"something": 1}, bad)
    trainer = make_trainer(x, y, "uniform", checkpoint_path=str(bad))
    with pytest.raises(ValueError, match="not a hardbatch training checkpoint"):
        trainer.fit()


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


def test_sampler_instance_with_bank_source_is_fed(digits):
    x, y = digits
    bank = hb.EmbeddingBank(len(x), 8)
    sampler = hb.KNNBatchSampler(bank, 32, refresh_every=2)
    trainer = Trainer(small_model(), InfoNCE(0.5), sampler, x, y, epochs=1, progress=False)
    assert trainer.bank is bank
    trainer.fit()
    assert bank.step == len(sampler)


def test_input_errors(digits):
    x, y = digits
    with pytest.raises(ValueError, match="one label per item"):
        Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], x, y[:10])
    with pytest.raises(ValueError, match="N=100"):
        Trainer(small_model(), InfoNCE(0.5), hb.UniformBatchSampler(100, 10), x, y)
    with pytest.raises(TypeError, match="unknown option"):
        Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], x, y, epoch=3)
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(ValueError, match="eval_data needs training labels"):
        Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], x, eval_data=(x, y))


def test_train_function_and_loss_labels(digits):
    x, y = digits
    result = train(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], x, y, epochs=1,
                   progress=False, loss_labels=True, augment=noise_augment)
    assert result.steps == len(result.history) > 0


# --------------------------------------------------------------------------- evaluation


def test_knn_and_linear_probe_on_separable_data():
    gen = torch.Generator().manual_seed(0)
    centers = torch.eye(4) * 5
    y_train = torch.arange(4).repeat(50)
    y_test = torch.arange(4).repeat(10)
    x_train = centers[y_train] + torch.randn(200, 4, generator=gen)
    x_test = centers[y_test] + torch.randn(40, 4, generator=gen)
    assert knn_accuracy(x_train, y_train, x_test, y_test, k=200, temperature=0.1) == 1.0
    assert linear_probe_accuracy(x_train, y_train, x_test, y_test) == 1.0
    # random labels: chance level, not perfect
    y_rand = torch.randint(0, 4, (200,), generator=gen)
    assert knn_accuracy(x_train, y_rand, x_test, y_test, k=5) < 0.8


def test_knn_weighted_vote_small_case():
    train_f = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    train_y = torch.tensor([0, 1, 1])
    # k=2 neighbours of [1, 0]: item 0 (class 0, cos 1) outweighs item 1 (class 1, cos 0.99)
    assert knn_accuracy(train_f, train_y, torch.tensor([[1.0, 0.0]]), torch.tensor([0]), k=2) == 1.0
    # k=3 with a flat temperature: classes 1 gets two votes
    assert knn_accuracy(train_f, train_y, torch.tensor([[1.0, 0.0]]), torch.tensor([1]), k=3,
                        temperature=100.0) == 1.0


class RecordingInfoNCE(InfoNCE):
    """InfoNCE that keeps each call's ``false_negatives`` mask."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.masks = []

    def forward(self, anchor, positive, labels=None, negatives=None, false_negatives=None):
        self.masks.append(false_negatives)
        return super().forward(anchor, positive, labels, negatives, false_negatives)


def test_per_item_guide_masks_pairs_closer_than_the_margin(digits, tmp_path):
    """Trainer(guide=[N, d']): the loss gets False/True exactly as the plain rule
    i != j and cos(g_i, g_j) > 1 - margin (float64 reference), for every step's batch."""
    x, y = digits
    g = x[:, :8].double() + 0.2 * torch.arange(8, dtype=torch.float64)
    np.save(tmp_path / "guide.npy", g.numpy())
    for guide in (g, str(tmp_path / "guide.npy")):
        loss = RecordingInfoNCE(0.5, form="simcse")
        trainer = Trainer(small_model(), loss, SAMPLERS["uniform"], x, y, augment=noise_augment,
                          epochs=1, progress=False, guide=guide, guide_margin=0.05)
        result = trainer.fit()
        assert len(loss.masks) == len(result.last_epoch_batches) == 5
        for mask, batch in zip(loss.masks, result.last_epoch_batches):
            rows = [g[i].tolist() for i in batch]
            norm = [math.sqrt(sum(v * v for v in r)) for r in rows]
            want = [[i != j and sum(a * b for a, b in zip(rows[i], rows[j])) / (norm[i] * norm[j])
                     > 1 - 0.05 for j in range(len(batch))] for i in range(len(batch))]
            assert mask.dtype == torch.bool and mask.tolist() == want
        assert any(m.any() for m in loss.masks) and not all(m.all() for m in loss.masks)


def test_module_guide_embeds_the_two_views(digits):
    x, y = digits
    seen = []

    class Guide(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(64, 6)

        def forward(self, v):
            seen.append(v.clone())
            return self.lin(v)

    guide = Guide()
    loss = RecordingInfoNCE(0.5)  # the SimCLR form
    Trainer(small_model(), loss, SAMPLERS["uniform"], x, y, augment=noise_augment, epochs=1,
            progress=False, guide=guide, guide_margin=0.2, max_steps=2).fit()
    assert len(loss.masks) == 2 and len(seen) == 4
    with torch.no_grad():
        for step, mask in enumerate(loss.masks):
            v1, v2 = seen[2 * step], seen[2 * step + 1]
            assert not torch.equal(v1, v2)  # the two augmented views
            assert torch.equal(mask, hb.guided_mask(guide(v1), guide(v2), 0.2, form="simclr"))


def test_guide_bad_input(digits):
    x, y = digits
    with pytest.raises(ValueError, match="guide_margin=0 with a per-item guide"):
        Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], x, y, progress=False,
                guide=x[:, :4])
    with pytest.raises(ValueError, match="guide_margin=3 must lie in"):
        TrainConfig(guide_margin=3)
    with pytest.raises(ValueError, match="guide_margin=nan must lie in"):
        TrainConfig(guide_margin=float("nan"))
    with pytest.raises(ValueError, match="guide has 10 rows but there are 160 items"):
        Trainer(small_model(), InfoNCE(0.5), SAMPLERS["uniform"], x, y, progress=False,
                guide=x[:10, :4], guide_margin=0.1)
