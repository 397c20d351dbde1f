"""``hardbatch.train``: a small, readable contrastive training loop (plain PyTorch) for any
hardbatch sampler and loss.

::

    from hardbatch.train import TrainConfig, Trainer

    trainer = Trainer(
        encoder, loss=InfoNCE(0.5), data=x, labels=y, head=projection_head,
        augment=my_augment,                          # augment(x_batch, generator) -> one view
        sampler=lambda bank: ProximityGraphSampler(bank, 256, candidates=500, neighbors=50),
        eval_data=(x_test, y_test),
        config=TrainConfig(epochs=50, lr=1e-3, seed=0, checkpoint_path="run.pt"),
    )
    result = trainer.fit()        # result.history: one dict per step; result.evals: evaluations

What one step does (``Trainer.train_step``):

1. take the next batch of item ids from the sampler (its time is ``sampler_seconds``);
2. make two views with ``augment`` (its own seeded ``torch.Generator``);
3. one forward pass of ``head(encoder(.))`` over both views, ``loss(z1, z2)``, backward, step;
4. store the anchor view's embeddings ``z1`` (detached, no extra forward) in the
   :class:`~hardbatch.EmbeddingBank`, from which graph samplers rebuild their graph every
   ``sampler.refresh_every`` steps and GCBS re-orders the items every epoch;
5. log loss, batch hardness (mean top-1 in-batch cosine similarity of ``z1``), false-negative
   rate (share of in-batch pairs with the same label, if labels are given), sampler time and
   step time; with ``reference=`` (a fixed ``[N, d']`` embedding shared by the runs being
   compared) also the batch's hardness, mean similarity and near-duplicate rate in it.

Data may be a tensor, a dataset of inputs, or a dataset of ``(index, view1, view2)`` items
(:class:`hardbatch.data.IndexedDataset`; :mod:`~hardbatch.train.step_batch`). Under
torch.distributed a one-item batch on any rank makes every rank skip that step.

Evaluation (every ``eval_every`` steps and at the end) embeds the items with ``encoder`` alone
(frozen features before the projection head, eval mode) and reports the weighted kNN accuracy
of InstDisc / SimCLR monitors (k=200, t=0.1) and the accuracy of a logistic-regression linear
probe, both fitted on the training items and scored on ``eval_data`` (or, when no ``eval_data``
is given, on a share of the training items that the kNN / probe fit leaves out; they are still
in contrastive training, without labels).

Checkpoints hold everything the run depends on (model, optimiser, bank, sampler state at the
number of steps done this epoch, RNG states, log), so a resumed run continues exactly as the
uninterrupted one would have (same weights and losses on CPU, for tensor data or
``num_workers=0``).

Modules: :mod:`~hardbatch.train.config` (:class:`TrainConfig`, :class:`TrainResult`),
:mod:`~hardbatch.train.trainer` (:class:`Trainer`, :func:`train`),
:mod:`~hardbatch.train.evaluation` (kNN and linear-probe accuracy of frozen features),
:mod:`~hardbatch.train.checkpoint` (what a checkpoint holds, seeding),
:mod:`~hardbatch.train.step_batch` (loading, the DDP skip, the per-step batch figures).
"""

from .checkpoint import seed_everything
from .config import TrainConfig, TrainResult
from .evaluation import embed, evaluate, knn_accuracy, linear_probe_accuracy
from .trainer import Trainer, train

__all__ = [
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "embed",
    "evaluate",
    "knn_accuracy",
    "linear_probe_accuracy",
    "seed_everything",
    "train",
]
