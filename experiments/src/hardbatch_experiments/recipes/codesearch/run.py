"""One code-search run: the arms, the run tag, training through ``SentenceTransformerTrainer``
with the arm's batches (and mined negatives), evaluation, and the run's JSON.

Arms (:func:`parse_arms`): ``default`` (``BatchSamplers.NO_DUPLICATES``), ``mined`` (the same
sampler on triplets with one mined hard negative per pair), every sampler name of
:mod:`hardbatch.registry` (``uniform``, ``knn``, ``proximity``, ``gcbs``; names another issue
registers, e.g. ``cluster`` and ``community``, become arms as soon as the registry has them)
through :func:`hardbatch.integrations.sentence_transformers.hard_negative_batch_sampler`,
and ``SAMPLER+mined`` (that sampler on the mined triplets; named explicitly, not part of ``all``),
and ``zeroshot`` (the starting model evaluated without training: the reference every arm moves
from; named explicitly).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hardbatch import CommunityBatchSampler
from hardbatch.integrations.sentence_transformers import (
    DEFAULT_SAMPLER,
    hard_negative_batch_sampler,
)
from hardbatch.cli_types import positive_float
from hardbatch.registry import canonical_sampler, sampler_names

from ... import runs
from ...sts import load_sentence_transformer
from . import plans
from .cache import mined_triplets, teacher_embeddings
from .data import CodePairs
from .evaluation import PROTOCOL, code_search_metrics, query_groups
from .model import (
    TimedSampler,
    column_length_collator,
    device_record,
    encode_texts,
    freeze_layers,
    library_versions,
    no_duplicates_sampler,
    training_classes,
)

__all__ = ["COMMUNITY", "COMMUNITY_CONFIGS", "HARDNESS", "HARDNESS_MODES", "K", "hardness_strength", "parse_hardness_strength", "MINED", "hardness_mode", "MODEL", "PRECISIONS", "TAG_DEFAULTS", "ZERO_SHOT", "Arm", "arm_label", "evaluate_model", "parse_arms",
           "result_path", "run_one", "run_tag"]

MODEL = "all-MiniLM-L6-v2"
#: The mined-negatives arm (``default`` + one mined negative per pair) and suffix (``knn+mined``).
MINED = "mined"
#: The suffix of the arms whose loss weights negatives by hardness (``hardness``,
#: ``mined+hardness``, ``community+mined+hardness``).
HARDNESS = "hardness"
#: The arm that evaluates the starting model without training.
ZERO_SHOT = "zeroshot"
#: The sampler of B3 and ``--community-config``'s values: ``hardbatch`` (the library's
#: defaults) or ``authors`` (``CommunityBatchSampler.AUTHORS``: B3's authors' code).
COMMUNITY = "community"
COMMUNITY_CONFIGS = ("hardbatch", "authors")
#: ``--precision`` values: fp32, or the trainer's bf16 mixed precision.
PRECISIONS = ("fp32", "bf16")
# options entering the run tag through a short hash when they differ from these values (device
# and precision: the CPU grids' values, so their names stay what they were before the options)
TAG_DEFAULTS = {"model": MODEL, "batch_size": 64, "lr": 2e-5, "warmup_ratio": 0.1,
                "eval_split": "valid,test", "eval_file": None, "eval_limit": None,
                "distractors": 999, "pool_seed": 0, "device": "cpu", "precision": "fp32"}
#: The cut-off of MRR@k and NDCG@k.
K = 10


class Arm(tuple):
    """``(sampler, mined, hardness)``: the batch sampler (``"default"`` or a registry name),
    whether the pairs carry one mined hard negative, and whether the loss weights its negatives
    by their hardness (sentence-transformers' ``MultipleNegativesRankingLoss(hardness_mode=...)``).
    ``name`` is the arm as given on the command line."""

    def __new__(cls, sampler: str, mined: bool, hardness: bool = False):
        return super().__new__(cls, (sampler, bool(mined), bool(hardness)))

    @property
    def sampler(self) -> str:
        return self[0]

    @property
    def mined(self) -> bool:
        return self[1]

    @property
    def hardness(self) -> bool:
        return self[2]

    @property
    def encodes(self) -> bool:
        """Whether the sampler reads embeddings (every registry sampler but ``uniform``)."""
        return self.sampler not in (DEFAULT_SAMPLER, "uniform", ZERO_SHOT)

    @property
    def name(self) -> str:
        parts = [] if self.sampler == DEFAULT_SAMPLER else [self.sampler]
        parts += [MINED] * self.mined + [HARDNESS] * self.hardness
        return "+".join(parts) or DEFAULT_SAMPLER


def parse_arms(value: str) -> list[Arm]:
    """``"all"`` (``default``, ``mined`` and every registry sampler), or comma-separated arm
    names, in order, once: ``default``, ``mined``, ``hardness``, ``mined+hardness``, a registry
    sampler, ``SAMPLER+mined``, ``SAMPLER+hardness``, ``SAMPLER+mined+hardness``, ``zeroshot``."""
    items = [v.strip().lower() for v in str(value).split(",") if v.strip()]
    valid = (DEFAULT_SAMPLER, MINED, HARDNESS, f"{MINED}+{HARDNESS}", *sampler_names(),
             f"SAMPLER+{MINED}", f"SAMPLER+{HARDNESS}", f"SAMPLER+{MINED}+{HARDNESS}",
             ZERO_SHOT, "all")
    if not items:
        raise ValueError(f"no arm given; use one of {', '.join(valid)}")
    if items == ["all"]:
        return [Arm(DEFAULT_SAMPLER, False), Arm(DEFAULT_SAMPLER, True),
                *(Arm(s, False) for s in sampler_names())]
    out = []
    for item in items:
        try:
            out.append(_parse_arm(item))
        except ValueError:
            raise ValueError(f"unknown arm {item!r}; use one of {', '.join(valid)} (SAMPLER: a "
                             f"sampler of hardbatch.registry)") from None
    return list(dict.fromkeys(out))


def _parse_arm(item: str) -> Arm:
    if item == ZERO_SHOT:
        return Arm(ZERO_SHOT, False)
    head, *mods = item.split("+")
    if head in (MINED, HARDNESS):  # "mined", "hardness", "mined+hardness": default batches
        head, mods = DEFAULT_SAMPLER, [head, *mods]
    elif head == DEFAULT_SAMPLER and mods:
        raise ValueError(item)
    sampler = head if head == DEFAULT_SAMPLER else canonical_sampler(head)
    if mods not in ([], [MINED], [HARDNESS], [MINED, HARDNESS]):
        raise ValueError(item)
    return Arm(sampler, MINED in mods, HARDNESS in mods)


def arm_label(arm: Arm, args) -> str:
    """The arm's part of the result name: its name, plus the arm-specific options that differ
    from their defaults (``@model100``: refreshed from the trained model every 100 steps;
    ``@code``: embeds the code column; ``@r50``: mined among the 50 nearest; ``@authors``: the
    community sampler with B3's authors' settings)."""
    label = arm.name
    if arm.encodes and args.refresh == "model":
        label += f"@model{args.refresh_every}"
    if arm.encodes and args.embed_column != "query":
        label += f"@{args.embed_column}"
    if arm.mined and args.range_max != 50:
        label += f"@r{args.range_max}"
    if arm.hardness:
        mode = hardness_mode(arm, args)
        label += f"@{HARDNESS_MODES[mode]}{hardness_strength(arm, args):g}"
    if _sampler_options(arm, args):
        label += f"@{args.community_config}"
    if getattr(args, "replay_plan", None):  # trained on a plan file's batches: another run
        label += "@replay"
    return label


def _sampler_options(arm: Arm, args) -> dict:
    """The arm's sampler options beyond the integration's defaults: B3's authors' settings for
    the community arms with ``--community-config authors``, else none."""
    config = getattr(args, "community_config", COMMUNITY_CONFIGS[0])
    return dict(CommunityBatchSampler.AUTHORS) if arm.sampler == COMMUNITY and \
        config == "authors" else {}


#: ``--hardness-mode`` values and their short form in the result names.
HARDNESS_MODES = {"in_batch_negatives": "ib", "hard_negatives": "hn", "all_negatives": "all"}


def hardness_mode(arm: Arm, args) -> str | None:
    """The ``hardness_mode`` of the arm's loss: None without ``+hardness``; ``--hardness-mode``
    where given; else ``all_negatives`` on mined triplets and ``in_batch_negatives`` on pairs."""
    if not arm.hardness:
        return None
    mode = getattr(args, "hardness_mode", "auto")
    if mode == "auto":
        return "all_negatives" if arm.mined else "in_batch_negatives"
    return mode


def hardness_strength(arm: Arm, args) -> float | None:
    """The ``hardness_strength`` of the arm's loss: None without ``+hardness``; else
    ``--hardness-strength``, one number for every mode or a ``{mode: strength}`` dict (the
    pilot's choice per mode, e.g. ``ib=10,all=5``: see :func:`parse_hardness_strength`)."""
    mode = hardness_mode(arm, args)
    if mode is None:
        return None
    strength = args.hardness_strength
    if not isinstance(strength, dict):
        return strength
    if mode not in strength:
        given = ",".join(f"{HARDNESS_MODES[m]}={v:g}" for m, v in strength.items())
        raise ValueError(f"--hardness-strength {given} gives no strength for {arm.name}'s mode "
                         f"{mode}: add {HARDNESS_MODES[mode]}=S")
    return strength[mode]


def parse_hardness_strength(text: str) -> float | dict[str, float]:
    """``--hardness-strength``: a positive number (every mode) or ``MODE=S,...`` with MODE a
    ``hardness_mode`` or its short form (``ib``, ``hn``, ``all``)."""
    short = {v: k for k, v in HARDNESS_MODES.items()}

    def positive(value: str, what: str) -> float:
        try:
            return positive_float(value)
        except argparse.ArgumentTypeError:
            raise ValueError(f"--hardness-strength {text!r}: {what} must be a positive number, "
                             f"got {value!r}") from None

    if "=" not in text:
        return positive(text, "the strength")
    out: dict[str, float] = {}
    for item in text.split(","):
        mode, _, value = item.partition("=")
        mode = short.get(mode.strip(), mode.strip())
        if mode not in HARDNESS_MODES or mode in out:
            raise ValueError(f"--hardness-strength {text!r}: {item!r} must be MODE=S with MODE "
                             f"one of {', '.join(sorted(short))} (or their long names), each "
                             "once; e.g. ib=10,all=5")
        out[mode] = positive(value, f"the strength of {HARDNESS_MODES[mode]}")
    return out


def run_tag(args, train_pairs: int) -> str:
    """``nN_stepsS`` (or ``nN_epE``) ``_LcodeqQuery[_fF][_hHASH]``: the training size, the token
    limits, the frozen layers and a hash of the shared options that differ from
    :data:`TAG_DEFAULTS` (the same for every arm of a comparison)."""
    size = f"steps{args.steps}" if args.steps else f"ep{args.epochs or 1:g}"
    base = f"n{train_pairs}_{size}_L{args.max_seq_length}q{args.max_query_length}"
    if args.freeze_layers:
        base += f"_f{args.freeze_layers}"
    changed = sorted((k, getattr(args, k, v)) for k, v in TAG_DEFAULTS.items()
                     if getattr(args, k, v) != v)
    digest = hashlib.sha1(json.dumps(changed).encode()).hexdigest()[:6]
    return f"{base}_h{digest}" if changed else base


def result_path(out: Path | str, label: str, seed: int, tag: str) -> Path:
    """``OUT/codesearch__ARM__seedS__TAG.json``."""
    return runs.result_path(out, "codesearch", label, seed=seed, tag=tag)


def evaluate_model(model, eval_sets: dict, max_length: int, batch_size: int, k: int) -> dict:
    """:func:`code_search_metrics` of ``model`` on every ``{name: (CodePairs, pools)}``: the
    distinct queries and the codes embedded with ``max_length`` tokens."""
    out = {}
    for name, (pairs, pools) in eval_sets.items():
        distinct, query_of = query_groups(pairs.queries)
        q = encode_texts(model, distinct, max_length, batch_size)
        c = encode_texts(model, pairs.codes, max_length, batch_size)
        out[name] = {"source": pairs.source,
                     **code_search_metrics(q, c, query_of, pairs.packages, pools, k)}
    return out


def _trace_callback(trace: dict, seed: int, sync: bool = False):
    """A ``TrainerCallback`` that reseeds at the start of training (the same dropout stream for
    every arm of a seed, whatever the sampler drew before) and records every step's wall time,
    its CPU time (all threads of the process; less sensitive to other load on the machine) and
    the logged losses. ``sync``: wait for the CUDA device at every step's end, so that a step's
    time is its own GPU work, not that of the kernels queued before it."""
    from transformers import TrainerCallback, set_seed

    class Trace(TrainerCallback):
        def on_train_begin(self, targs, state, control, **kw):
            set_seed(seed)
            if sync:
                torch.cuda.synchronize()
            trace["last"] = (time.perf_counter(), time.process_time())

        def on_step_end(self, targs, state, control, **kw):
            if sync:
                torch.cuda.synchronize()
            now = (time.perf_counter(), time.process_time())
            trace["step_s"].append(now[0] - trace["last"][0])
            trace["step_cpu_s"].append(now[1] - trace["last"][1])
            trace["last"] = now

        def on_log(self, targs, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                trace["step"].append(int(state.global_step))
                trace["loss"].append(float(logs["loss"]))

    return Trace()


def _hard_sampler(args, arm: Arm, model, train, seed_emb: np.ndarray):
    """The ``batch_sampler`` callable of a registry-sampler arm (through the library's
    sentence-transformers integration), wrapped so that the time spent drawing batches is
    measured; returns ``(callable, wrappers built)``."""
    options = {"embeddings": seed_emb} if arm.encodes else {}  # uniform takes no embeddings
    options.update(_sampler_options(arm, args))
    make = hard_negative_batch_sampler(
        model, arm.sampler, train_dataset=train,
        text_column="anchor" if args.embed_column == "query" else "positive",
        refresh_every=args.refresh_every if args.refresh == "model" else None,
        encode_batch_size=args.encode_batch_size, **options)
    built: list[TimedSampler] = []

    def batch_sampler(dataset, *a, **kw):
        t0 = time.perf_counter()
        wrapped = TimedSampler(make(dataset, *a, **kw))
        wrapped.seconds += time.perf_counter() - t0  # first graph / order built here
        built.append(wrapped)
        return wrapped

    return batch_sampler, built


def _train(args, model, train, batch_sampler, lengths: dict, trace: dict, seed: int,
           classes, loss_options: dict) -> tuple[float, int, float]:
    """Fine-tune ``model`` with ``SentenceTransformerTrainer`` and MNRL; returns (wall seconds,
    steps, training loss)."""
    trainer_class, arguments_class, mnrl_class = classes
    device = getattr(args, "device", "cpu")
    with tempfile.TemporaryDirectory(prefix="hb-codesearch-") as tmp:
        targs = arguments_class(
            output_dir=tmp, per_device_train_batch_size=args.batch_size,
            max_steps=args.steps or -1, num_train_epochs=args.epochs or 1,
            learning_rate=args.lr, warmup_steps=args.warmup_ratio,  # < 1: a share of the steps
            lr_scheduler_type="linear",
            weight_decay=0.0, seed=seed, data_seed=seed, dataloader_drop_last=True,
            save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=device == "cpu",
            bf16=getattr(args, "precision", "fp32") == "bf16",
            logging_steps=max(1, min(10, (args.steps or 100) // 10)), batch_sampler=batch_sampler)
        trainer = trainer_class(
            model=model, args=targs, train_dataset=train, loss=mnrl_class(model, scale=args.scale, **loss_options),
            data_collator=column_length_collator(model, lengths),
            callbacks=[_trace_callback(trace, seed, sync=device == "cuda")])
        t0 = time.perf_counter()
        result = trainer.train()
        return time.perf_counter() - t0, int(result.global_step), float(result.training_loss)


def _loss_options(arm: Arm, args) -> dict:
    """The MNRL options beyond ``scale``: the hardness weighting of a ``+hardness`` arm."""
    mode = hardness_mode(arm, args)
    if mode is None:
        return {}
    return {"hardness_mode": mode, "hardness_strength": hardness_strength(arm, args)}


def run_one(args, arm: Arm, seed: int, path: Path, train_pairs: CodePairs, eval_sets: dict,
            command: str, extra: dict | None = None) -> dict:
    """Train the arm with ``seed``, evaluate it, write ``path`` (JSON) and return the record
    (``extra``: more top-level fields of the record, e.g. a time budget's account). The model,
    the mining, the encodings and the training run on ``args.device`` (default cpu). With
    ``args.write_plan`` the batches the trainer got go to a plan file beside the JSON; with
    ``args.replay_plan`` the trainer gets that file's batches instead (:mod:`.plans`)."""
    from datasets import Dataset

    t_start, c_start = time.perf_counter(), time.process_time()
    device = getattr(args, "device", "cpu")
    device_record(device, reset=True)
    torch.manual_seed(seed)
    np.random.seed(seed)
    model = load_sentence_transformer(args.model, device=device)
    eval_len = model.max_seq_length  # the model's own limit (256 for MiniLM)
    params = freeze_layers(model, args.freeze_layers)
    train = Dataset.from_dict({"anchor": train_pairs.queries, "positive": train_pairs.codes})
    timings = {"mining": 0.0, "encoding_refresh": 0.0, "training": 0.0, "evaluation": 0.0}
    cache_reads = []  # (seconds read from the cache, seconds charged instead)
    mining = teacher = None
    if arm.mined:  # its cost is charged to the run, cached or not
        train, mining = mined_triplets(
            model, args.model, train_pairs, range_max=args.range_max,
            relative_margin=args.relative_margin, max_length=args.max_seq_length,
            batch_size=args.encode_batch_size, use_cache=not args.no_cache)
        timings["mining"] = mining["seconds"]
        cache_reads += [(mining["read_s"], mining["seconds"])] if mining["cached"] else []
    built: list[TimedSampler] = []
    batch_sampler, seed_emb, plan = no_duplicates_sampler(), None, None
    replay = getattr(args, "replay_plan", None) and arm.sampler != ZERO_SHOT
    if replay:  # the plan's batches, checked to be this arm's, seed's, rows' and settings'
        batch_sampler, plan = plans.replay_sampler(
            args, arm, seed, train, plans.training_settings(args, arm, _loss_options(arm, args)))
    elif arm.sampler not in (DEFAULT_SAMPLER, ZERO_SHOT):
        if arm.encodes:  # the teacher: the starting model's embeddings, computed once
            column = "anchor" if args.embed_column == "query" else "positive"
            length = args.max_query_length if column == "anchor" else args.max_seq_length
            seed_emb, teacher = teacher_embeddings(model, args.model, list(train[column]), length,
                                                   args.encode_batch_size, not args.no_cache)
            timings["encoding_refresh"] += teacher["seconds"]
            cache_reads += [(teacher["read_s"], teacher["seconds"])] if teacher["cached"] else []
        batch_sampler, built = _hard_sampler(args, arm, model, train, seed_emb)
    lengths = {"anchor": args.max_query_length, "positive": args.max_seq_length,
               "negative": args.max_seq_length}
    trace: dict = {"step": [], "loss": [], "step_s": [], "step_cpu_s": []}
    model.max_seq_length = args.max_seq_length  # encodings by the sampler's refreshes
    recorders: list = []  # with --write-plan: the trainer's batch sampler, recorded
    if arm.sampler == ZERO_SHOT:
        train_wall, steps, train_loss = 0.0, 0, None
    else:
        classes = training_classes()
        if getattr(args, "write_plan", None) is not None:
            classes = (plans.recording_trainer(classes[0], recorders), *classes[1:])
        train_wall, steps, train_loss = _train(args, model, train, batch_sampler, lengths,
                                               trace, seed, classes, _loss_options(arm, args))
    trace.pop("last", None)
    sampler_s = sum(b.seconds for b in built)
    timings["encoding_refresh"] += sampler_s
    timings["training"] = train_wall - sampler_s
    if recorders:  # outside the timings above (drawing a partial epoch's rest included)
        plan = plans.write_run_plan(args, arm, seed, path, train, recorders[0], {
            "label": arm_label(arm, args), "tag": run_tag(args, len(train_pairs)),
            "command": command,
            "training": plans.training_settings(args, arm, _loss_options(arm, args))},
            embeddings=seed_emb)
    model.max_seq_length = eval_len
    model.eval()
    if args.save_model:
        model.save(str(Path(args.save_model) / path.stem))
    t0, c0 = time.perf_counter(), time.process_time()
    metrics = evaluate_model(model, eval_sets, eval_len, args.eval_batch_size, K)
    timings["evaluation"] = time.perf_counter() - t0
    cpu = {"evaluation": time.process_time() - c0, "run": time.process_time() - c_start}
    timings["wall"] = time.perf_counter() - t_start
    # the wall time had nothing been cached: cache reads replaced by the computations they saved
    timings["charged_wall"] = timings["wall"] + sum(cost - read for read, cost in cache_reads)
    step_s = trace["step_s"][1:] or trace["step_s"]  # the first step warms up
    step_cpu = trace["step_cpu_s"][1:] or trace["step_cpu_s"]
    hard = built[-1] if built else None
    record = {
        "benchmark": "codesearch", "arm": arm.name, "label": arm_label(arm, args),
        "sampler": arm.sampler, "mined": arm.mined, "hardness": arm.hardness, "seed": seed,
        "tag": run_tag(args, len(train_pairs)),
        "config": {
            "model": args.model, "train_pairs": len(train_pairs), "train_rows": len(train),
            "train_limit": args.train_limit, "steps": args.steps, "epochs": args.epochs,
            "batch_size": args.batch_size, "lr": args.lr, "warmup_ratio": args.warmup_ratio,
            "optimizer": "AdamW (HF Trainer default), linear decay, no weight decay",
            "loss": f"MultipleNegativesRankingLoss(scale={args.scale:g}"
                    + "".join(f", {k}={v!r}" for k, v in _loss_options(arm, args).items()) + ")",
            "hardness_mode": hardness_mode(arm, args),
            "hardness_strength": hardness_strength(arm, args),
            "max_seq_length_code": args.max_seq_length,
            "max_seq_length_query": args.max_query_length, "max_seq_length_eval": eval_len,
            "freeze_layers": args.freeze_layers, "parameters": params, "drop_last": True,
            "device": device, "precision": getattr(args, "precision", "fp32"),
            "batch_sampler": (None if arm.sampler == ZERO_SHOT else
                              f"plan_batch_sampler({args.replay_plan!r})" if replay else
                              "sentence-transformers BatchSamplers.NO_DUPLICATES"
                              if arm.sampler == DEFAULT_SAMPLER else
                              f"hard_negative_batch_sampler({arm.sampler!r})"),
            "sampler_options": _sampler_options(arm, args),
            "refresh": (args.refresh if arm.encodes else None),
            "refresh_every": (args.refresh_every if arm.encodes and args.refresh == "model"
                              else None),
            "embed_column": args.embed_column if arm.encodes else None,
            "threads": args.threads, "eval_batch_size": args.eval_batch_size,
            "eval_limit": args.eval_limit, "distractors": args.distractors,
            "pool_seed": args.pool_seed, "k": K,
        },
        "mining": mining, "teacher": teacher,
        "protocol": PROTOCOL,
        "metrics": metrics,
        "steps": steps, "train_loss": train_loss,
        "trace": trace,
        "seconds_per_step": float(np.median(step_s)) if step_s else None,
        "cpu_seconds_per_step": float(np.median(step_cpu)) if step_cpu else None,
        "refreshes": getattr(hard, "refreshes", None) if hard is not None else None,
        "time_s": timings, "wall_time_s": timings["wall"], "cpu_time_s": cpu,
        "gpu": device_record(device),
        "time_note": "time_s: mining and the teacher's encoding (in encoding_refresh) are their "
                     "computing cost even when read from the cache (mining / teacher 'cached'); "
                     "wall: this process, charged_wall: wall with cached parts at their cost; "
                     "cpu_time_s: CPU seconds of all threads (less sensitive to other load)",
        "command": command,
        "env": {**runs.env_record(), **library_versions(), "load_average": os.getloadavg()},
        **({"plan": plan} if plan else {}),
        **(extra or {}),
    }
    runs.write_json_atomic(path, record)
    return record
