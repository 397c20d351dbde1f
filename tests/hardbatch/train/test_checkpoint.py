"""hardbatch.train.checkpoint: a resumed run equals the uninterrupted one (weights, losses,
batches, evaluations, bank), periodic checkpoints, and a bad checkpoint file."""

import json

import pytest
import torch
from train_support import make_trainer

import hardbatch as hb

pytestmark = pytest.mark.usefixtures("one_thread")


def sscl(seed):
    return hb.SSCLLoss(0.5, tau_plus=0.1, beta=1.0, generator=torch.Generator().manual_seed(seed))


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
