"""One GraphCL run (train, embed, score, write the JSON) and the settings it depends on: the
paper's per-dataset hyper-parameters (Table 15), the CLI defaults, the run tag naming what
differs from the paper's configuration."""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hardbatch.integrations.pyg_augment import AUGS, augment, augment_released

from ... import runs
from ...factories import LOSS_SETTINGS, gcbs_quantile, make_loss, make_sampler
from .evaluation import C_GRID, evaluate_embeddings
from .model import GraphCL, embed_all
from .sampling import (
    CoverageProximitySampler,
    centred,
    encode_space,
    epoch_coverage,
    option_tag,
    restart_schedule,
    sampler_options,
)

__all__ = ["ALIASES", "CLI_DEFAULTS", "DEFAULTS", "FALLBACK", "Hyper", "aug_style",
           "canonical_dataset", "hyper_for", "result_path", "run_one", "run_tag"]


@dataclass(frozen=True)
class Hyper:
    """One dataset's training settings: batch size B, epochs, refresh interval t, M, K."""

    batch_size: int
    epochs: int
    refresh_every: int
    candidates: int
    neighbors: int


# BatchSampler paper, Table 15: B / epochs / t / M / K
DEFAULTS = {
    "IMDB-BINARY": Hyper(256, 100, 25, 500, 100),
    "COLLAB": Hyper(128, 20, 50, 1000, 100),
    "REDDIT-BINARY": Hyper(128, 50, 50, 500, 100),
    "PROTEINS": Hyper(128, 20, 50, 500, 100),
    "MUTAG": Hyper(128, 20, 50, 100, 50),
    "NCI1": Hyper(128, 20, 50, 1000, 100),
    "IMDB-MULTI": Hyper(128, 50, 25, 500, 100),
}
FALLBACK = Hyper(128, 20, 50, 1000, 100)
ALIASES = {"IMDB-B": "IMDB-BINARY", "IMDB-M": "IMDB-MULTI", "REDDIT-B": "REDDIT-BINARY"}


def canonical_dataset(name: str) -> str:
    """``name`` with the paper's short names expanded (``IMDB-B`` -> ``IMDB-BINARY``)."""
    return ALIASES.get(name, name)


def hyper_for(name: str) -> Hyper:
    """The paper's B / epochs / t / M / K for dataset ``name`` (:data:`FALLBACK` if absent)."""
    return DEFAULTS.get(canonical_dataset(name), FALLBACK)


def run_tag(args, hyper: Hyper, sampler: str | None = None) -> str:
    """'' for the paper's configuration, else a short suffix naming what differs.

    The sampler options of :mod:`.sampling` enter the tag of the samplers they apply to only
    (``sampler`` None: as for the proximity sampler), so a uniform run is shared by every
    configuration of its seed."""
    parts = []
    if args.epochs is not None and args.epochs != hyper.epochs:
        parts.append(f"e{args.epochs}")
    if args.batch_size is not None and args.batch_size != hyper.batch_size:
        parts.append(f"b{args.batch_size}")
    if args.views != "orig+aug":
        parts.append("augaug")
    if args.features != "auto":
        parts.append(f"f{args.features}")
    if args.bank_init != "encode":
        parts.append("bankrand")
    if getattr(args, "svm_kernel", "precomputed") != "precomputed":
        parts.append("svmrbf")
    if args.aug_ratio != CLI_DEFAULTS["aug_ratio"]:
        parts.append(f"r{args.aug_ratio:g}")
    if aug_style(args) != "paper":
        parts.append(f"aug{aug_style(args)}")
    # any other non-default option: a short hash, so a sweep never reuses (or is taken for) the
    # paper configuration's result files
    changed = {k: getattr(args, k) for k in _HASHED
               if getattr(args, k, CLI_DEFAULTS[k]) != CLI_DEFAULTS[k]}
    for key, paper in (("refresh_every", hyper.refresh_every), ("candidates", hyper.candidates),
                       ("neighbors", hyper.neighbors)):
        value = getattr(args, key, None)
        if value is not None and value != paper:
            changed[key] = value
    if changed:
        digest = hashlib.sha1(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:6]
        parts.append(f"h{digest}")
    parts += option_tag(sampler_options(args, sampler or "proximity"))
    return "-".join(parts)


# Defaults of the CLI options that have no per-dataset value (the parser reads them from here)
CLI_DEFAULTS = {"temperature": 0.2, "lr": 0.01, "tau_plus": 0.1, "beta": 1.0, "aug_ratio": 0.2,
                 "degree_cap": 64}
# those of them whose change the tag does not name otherwise: it adds the options hash
_HASHED = ("temperature", "lr", "tau_plus", "beta", "degree_cap")


def aug_style(args) -> str:
    """``--aug-style`` (``"paper"`` for argument objects without it)."""
    return getattr(args, "aug_style", "paper")


def result_path(out: Path, dataset: str, sampler: str, loss: str, seed: int, tag: str = "") -> Path:
    """``OUT/DATASET__SAMPLER__LOSS__seedS[__TAG].json``."""
    return runs.result_path(out, dataset, sampler, loss, seed=seed, tag=tag)


def run_one(args, dataset, sampler_name: str, loss_name: str, seed: int, path: Path,
            log=print) -> dict:
    """Train and evaluate one configuration; writes ``path`` (JSON) and returns the record."""
    from hardbatch import EmbeddingBank
    from hardbatch.metrics import (
        NEAR_DUPLICATE,
        batch_false_negative_rate,
        batch_hardness,
        batch_near_duplicate_rate,
    )

    t_start = time.perf_counter()
    c_start = time.process_time()
    name = dataset.name
    hyper = hyper_for(name)
    n = len(dataset)
    bsz = args.batch_size or hyper.batch_size
    if bsz >= n:
        bsz = max(2, n // 2)
    epochs = args.epochs or hyper.epochs
    cands = min(args.candidates or hyper.candidates, n - 1)
    neigh = min(args.neighbors or hyper.neighbors, cands - 1)
    hp = {"batch_size": bsz, "epochs": epochs,
          "refresh_every": args.refresh_every or hyper.refresh_every,
          "candidates": cands, "neighbors": neigh,
          "gcbs_quantile": gcbs_quantile(n, bsz), "temperature": args.temperature,
          "lr": args.lr, "hidden": 32, "layers": 3, "aug_ratio": args.aug_ratio,
          "augmentations": list(AUGS), "aug_style": aug_style(args), "views": args.views,
          "loss_form": "simcse",
          "tau_plus": args.tau_plus if "tau_plus" in LOSS_SETTINGS[loss_name] else None,
          "beta": args.beta if "beta" in LOSS_SETTINGS[loss_name] else None,
          "features": dataset.feature_kind, "num_features": dataset.num_features,
          "bank_init": args.bank_init, "loader": args.loader, "message_passing": "csr-spmm",
          "threads": torch.get_num_threads(),
          "eval": {"classifier": "SVC(rbf)", "kernel_impl": args.svm_kernel,
                   "C_grid": list(C_GRID), "outer_folds": 10, "inner_folds": 5}}
    torch.manual_seed(seed)
    np.random.seed(seed)
    gen = torch.Generator().manual_seed(seed + 7919)
    released = aug_style(args) == "released"
    np_rng = np.random.RandomState(seed + 7919)
    model = GraphCL(dataset.num_features)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = make_loss(loss_name, args.temperature, form="simcse", tau_plus=args.tau_plus,
                        beta=args.beta, generator=torch.Generator().manual_seed(seed))
    timings = {"bank_init": 0.0, "data": 0.0, "augment": 0.0, "forward_backward": 0.0,
               "metrics": 0.0, "sampler": 0.0, "eval_embed": 0.0, "eval_svm": 0.0}
    opts = sampler_options(args, sampler_name)
    space, warm = opts["sampler_space"], opts["warmup_epochs"]
    coverage = opts["epoch_mode"] == "coverage"
    restart, hp["restart"] = restart_schedule(opts)
    per_epoch = -(-n // bsz)
    budget = epochs * per_epoch  # the uniform run's steps: every arm trains this many
    if sampler_name != "uniform":
        hp["sampler_options"] = opts
        if coverage:
            hp["step_budget"] = budget
    bank = EmbeddingBank(n, model.encoder.out_dim, seed=seed)  # z has the readout's width
    t0 = time.perf_counter()  # the untrained encoder's readout (no random numbers drawn)
    untrained = embed_all(model, dataset, self_loops=released)
    # The reference of every arm of this seed: that readout, centred (the raw sum readout of an
    # untrained GIN puts every pair of graphs near cosine 1, which separates nothing).
    reference = untrained - untrained.mean(dim=0, keepdim=True)
    timings["reference"] = time.perf_counter() - t0
    if args.bank_init == "encode" and sampler_name != "uniform":
        bank.embeddings.copy_(encode_space(model, untrained, space))  # the same encoding pass
        timings["bank_init"] = timings["reference"]
    source = (lambda: centred(bank.embeddings)) if space == "centred-readout" else bank

    def build(kind: str):
        if kind == "warm-up":  # the uniform arm's sampler: the same batches in these epochs
            return make_sampler("uniform", bank, bsz, seed=seed)
        if coverage:
            return CoverageProximitySampler(
                source, bsz, candidates=cands, neighbors=neigh, restart=restart,
                refresh_every=hp["refresh_every"], epochs=epochs, seed=seed,
                budget=budget - warm * per_epoch)
        return make_sampler(sampler_name, source, bsz, seed=seed, candidates=cands,
                            neighbors=neigh, restart=restart, refresh_every=hp["refresh_every"],
                            epochs=epochs, quantile=hp["gcbs_quantile"])

    def loader_of(sampler):
        if args.loader == "pyg":
            from torch_geometric.loader import DataLoader as PygLoader

            return PygLoader(dataset, batch_sampler=sampler)
        return torch.utils.data.DataLoader(_IndexDataset(n), batch_sampler=sampler,
                                           collate_fn=dataset.collate)

    built: dict = {}  # "warm-up" / "main" -> (sampler, loader)
    labels = dataset.y.numpy()
    trace = {"step": [], "epoch": [], "loss": [], "hardness": [], "false_negative_rate": [],
             "reference_hardness": [], "reference_near_duplicate_rate": []}
    step = epoch = 0
    epoch_wall, epoch_cpu, epoch_steps_list, epoch_cov = [], [], [], []
    model.train()
    while (step < budget) if coverage else (epoch < epochs):
        e_wall, e_cpu = time.perf_counter(), time.process_time()
        kind = "warm-up" if epoch < warm else "main"
        if kind not in built:
            if kind == "main" and warm:  # the hard sampler starts from the current model
                t0 = time.perf_counter()
                bank.embeddings.copy_(encode_space(
                    model, embed_all(model, dataset, self_loops=released), space))
                timings["bank_init"] += time.perf_counter() - t0
            made = build(kind)
            built[kind] = (made, loader_of(made))
        sampler, loader = built[kind]
        sampler.set_epoch(epoch)
        it = iter(loader)
        epoch_loss, epoch_steps = 0.0, 0
        while True:
            t0 = time.perf_counter()
            try:
                data = next(it)
            except StopIteration:
                timings["data"] += time.perf_counter() - t0
                break
            t1 = time.perf_counter()
            timings["data"] += t1 - t0
            g = data.num_graphs
            if released:
                oei, ax, aei, ab, _ = augment_released(data.x, data.edge_index, data.batch, g,
                                                       np_rng)
                ox, ob = data.x, data.batch
            else:
                ax, aei, ab, _ = augment(data.x, data.edge_index, data.batch, g, args.aug_ratio,
                                         gen)
                if args.views == "aug+aug":
                    ox, oei, ob = augment(data.x, data.edge_index, data.batch, g,
                                          args.aug_ratio, gen)[:3]
                else:
                    ox, oei, ob = data.x, data.edge_index, data.batch
            t2 = time.perf_counter()
            timings["augment"] += t2 - t1
            h1, z1 = model(ox, oei, ob, g)
            _, z2 = model(ax, aei, ab, g, undirected=not released)
            loss = loss_fn(z1, z2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            ids = data.idx
            bank.update(ids, (z1 if space == "projection" else h1).detach())
            t3 = time.perf_counter()
            timings["forward_backward"] += t3 - t2
            lv = float(loss.detach())
            if not math.isfinite(lv):
                raise FloatingPointError(f"loss became {lv} at step {step}")
            if step % args.log_every == 0:
                idn = ids.numpy()
                trace["step"].append(step)
                trace["epoch"].append(epoch)
                trace["loss"].append(lv)
                trace["hardness"].append(batch_hardness(bank.embeddings, idn))
                trace["false_negative_rate"].append(batch_false_negative_rate(labels, idn))
                trace["reference_hardness"].append(batch_hardness(reference, idn))
                trace["reference_near_duplicate_rate"].append(
                    batch_near_duplicate_rate(reference, idn))
            timings["metrics"] += time.perf_counter() - t3
            epoch_loss += lv
            epoch_steps += 1
            step += 1
        epoch_wall.append(time.perf_counter() - e_wall)
        epoch_cpu.append(time.process_time() - e_cpu)
        epoch_steps_list.append(epoch_steps)
        epoch_cov.append(epoch_coverage(sampler))
        if args.verbose:
            log(f"  epoch {epoch + 1}/{epochs} loss {epoch_loss / max(1, epoch_steps):.4f} "
                f"({time.perf_counter() - t_start:.1f}s)")
        epoch += 1
        if not epoch_steps:  # nothing left to draw (cannot happen within the budget)
            break
    timings["sampler"] = float(sum(getattr(s, "sampler_seconds", 0.0) for s, _ in
                                   built.values()))
    timings["data"] -= timings["sampler"]  # data = collation only
    t0 = time.perf_counter()
    emb = embed_all(model, dataset, self_loops=released).numpy().astype(np.float64)
    timings["eval_embed"] = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    ev = evaluate_embeddings(emb, labels, seed, kernel=args.svm_kernel)
    timings["eval_svm"] = time.perf_counter() - t0
    eval_cpu = time.process_time() - c0
    train_time = sum(timings[k] for k in ("bank_init", "data", "augment", "forward_backward",
                                           "metrics", "sampler"))
    record = {
        "dataset": name, "sampler": sampler_name, "loss": loss_name, "seed": seed,
        "tag": run_tag(args, hyper, sampler_name), "config": hp, "num_graphs": n,
        "num_classes": dataset.num_classes, "steps": step,
        "accuracy": ev["accuracy"], "fold_accuracies": ev["fold_accuracies"],
        "chosen_C": ev["chosen_C"],
        "wall_time_s": time.perf_counter() - t_start, "train_time_s": train_time,
        "cpu_time_s": time.process_time() - c_start, "eval_svm_cpu_s": eval_cpu,
        "epoch_wall_s": epoch_wall, "epoch_cpu_s": epoch_cpu,
        "epochs_run": epoch, "epoch_steps": epoch_steps_list, "epoch_coverage": epoch_cov,
        "timings_s": timings,
        "trace": trace,
        "trace_note": ("per logged step: hardness = mean top-1 negative cosine and "
                       "false_negative_rate = share of same-label pairs, of the batch's bank "
                       "embeddings right after this step's update (anchor readout); "
                       "reference_* = the same batch in the reference embedding"),
        "mean_hardness": float(np.nanmean(trace["hardness"])) if trace["hardness"] else None,
        "mean_false_negative_rate": (float(np.nanmean(trace["false_negative_rate"]))
                                     if trace["false_negative_rate"] else None),
        "reference_diagnostics": runs.reference_summary(
            trace, "readout of the untrained encoder (the seed's initial weights, before any "
                   "step), centred: the same for every sampler and loss of this seed",
            NEAR_DUPLICATE),
        "env": runs.env_record(),
    }
    runs.write_json_atomic(path, record)
    return record


class _IndexDataset(torch.utils.data.Dataset):
    """Yields indices; with ``__getitems__`` the loader hands the whole id list to collate."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i

    def __getitems__(self, ids):
        return list(ids)
