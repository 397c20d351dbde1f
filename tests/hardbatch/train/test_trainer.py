"""hardbatch.train.trainer: the Trainer's steps and runs (bank feeding, logs, refreshes,
evaluation schedule, seeds), the train() function and the Trainer's input checks."""

import json
import math

import pytest
import torch
from train_support import SAMPLERS, make_trainer, noise_augment, small_model

import hardbatch as hb
from hardbatch.losses import InfoNCE
from hardbatch.metrics import batch_false_negative_rate
from hardbatch.train import TrainConfig, Trainer, train
from hardbatch_experiments.datasets import load_digits

pytestmark = pytest.mark.usefixtures("one_thread")


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


# --------------------------------------------------------------------------- inputs


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
