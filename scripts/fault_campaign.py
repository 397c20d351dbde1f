#!/usr/bin/env python3
"""Fault campaign (issue 34): bad inputs, resumes, corrupted checkpoints, a killed rank.

    python scripts/fault_campaign.py                 # the full campaign (about 2 minutes)
    python scripts/fault_campaign.py --quick         # a few cases of each part (seconds)
    python scripts/fault_campaign.py --json out.json --seed 1

Parts (each prints one line of figures; docs/reliability.md keeps the last ones):

* ``samplers``: random bad values for one argument of a random sampler (uniform, kNN,
  proximity graph, GCBS); every call must raise ``ValueError`` / ``TypeError`` naming that
  argument. Also random damage to saved states (keys removed, values replaced, another kind's
  state): ``load_state_dict`` must raise naming a key, the kind, a setting or "corrupted".
* ``losses``: random bad values for one argument of a random loss (functional or module);
  every call must raise naming that argument.
* ``resume``: random samplers, seeds and cut points (with a prefetching loader's lag):
  ``state_dict`` through ``torch.save`` / ``torch.load(weights_only=True)`` must resume exactly
  the remaining batches and the next epoch.
* ``checkpoint``: a short ``Trainer`` run's checkpoint with one byte flipped inside a tensor
  record (every flip must raise "corrupted") or anywhere in the file (a flip must raise or load
  the same content: no silent change).
* ``killed_rank``: ``scripts/distributed_stall.py kill`` under torchrun (two gloo processes):
  the surviving rank must raise, not hang (skipped without torchrun).
* ``refresh``: an exact kNN graph rebuilt every step (the issue's slow sampler): its cost per
  batch and the one warning it now gives.

Exit status 1 if any case failed. The failures are printed (the first ten of each part).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import hardbatch as hb
from hardbatch._integrity import digest, span_offset, tensor_record_spans

REPO = Path(__file__).resolve().parents[1]
N, D, B = 120, 8, 8

# -- bad values, by the kind of argument -------------------------------------------------------

NOT_INTS = [2.5, "8", None, True, [4], float("nan")]
BAD = {
    "batch_size": [0, -3, N + 1, *NOT_INTS],
    "seed": [1.5, "0", None, [0]],
    "rank": [-1, 7, 1.5, "0"],
    "world_size": [0, -2, 1000, 2.5, "2"],
    "refresh_every": [0, -1, 1.5, "5", True],
    "refresh_lag": [-1, 1.5, "1"],
    "prefetch": [-1, 1.5, "2"],
    "device": ["gpu", 1.5, object(), "cuda:abc", [0]],
    "precision": ["fp8", 16, None],
    "candidates": [0, -1, 2.5, "50"],
    "neighbors": [0, -1, N, 2.5],
    "restart": [1.0, -0.1, "0.2", float("nan"), 2],
    "walk": ["xyz", 3, None],
    "graph": ["foo", 1],
    "quantile": [0, 1, 1.5, -0.2, "0.9"],
    "method": ["bogus", 3],
    "duplicate_keys": [[0] * (N - 1), [[1]] * N, "abc"],
    "embeddings": [np.full((N, D), np.nan, np.float32), np.ones(N, np.float32),
                   np.ones((0, D), np.float32), np.array([["a"] * D] * N)],
}
SAMPLER_ARGS = {
    "uniform": ("batch_size", "seed", "rank", "world_size", "duplicate_keys"),
    "knn": ("batch_size", "seed", "rank", "world_size", "refresh_every", "refresh_lag",
            "prefetch", "device", "duplicate_keys", "embeddings"),
    "proximity": ("batch_size", "seed", "rank", "world_size", "refresh_every", "refresh_lag",
                  "prefetch", "device", "precision", "candidates", "neighbors", "restart",
                  "walk", "graph", "duplicate_keys", "embeddings"),
    "gcbs": ("batch_size", "seed", "rank", "world_size", "refresh_lag", "device", "precision",
             "quantile", "method", "duplicate_keys", "embeddings"),
}


def make_sampler(kind: str, x, **kw):
    """A small sampler of ``kind``; keyword arguments override its defaults."""
    if kind == "uniform":
        return hb.UniformBatchSampler(kw.pop("n", N), kw.pop("batch_size", B), **kw)
    base = {"batch_size": B, "embeddings": x}
    if kind == "knn":
        base["refresh_every"] = 5
    elif kind == "proximity":
        base.update(candidates=30, neighbors=6, refresh_every=5)
    else:
        base["quantile"] = 0.9
    base.update(kw)
    cls = {"knn": hb.KNNBatchSampler, "proximity": hb.ProximityGraphSampler,
           "gcbs": hb.GCBSSampler}[kind]
    return cls(base.pop("embeddings"), base.pop("batch_size"), **base)


def names(err: BaseException, parameter: str) -> bool:
    return isinstance(err, (ValueError, TypeError)) and parameter in str(err)


def sampler_cases(rng: random.Random, x, count: int) -> tuple[int, list[str]]:
    """Bad constructor arguments and damaged states; (cases, failures)."""
    failures = []
    for _ in range(count):
        kind = rng.choice(sorted(SAMPLER_ARGS))
        arg = rng.choice(SAMPLER_ARGS[kind])
        value = rng.choice(BAD[arg])
        kw = {arg: value}
        if arg == "rank":
            kw["world_size"] = 2
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                list(make_sampler(kind, x, **kw))
        except Exception as err:  # noqa: BLE001 - what is raised is the finding
            if not names(err, arg):
                failures.append(f"{kind}({arg}={value!r:.30}): {type(err).__name__}: {err}")
        else:
            failures.append(f"{kind}({arg}={value!r:.30}): accepted")
    states = {kind: _state(make_sampler(kind, x)) for kind in SAMPLER_ARGS}
    for _ in range(count // 2):
        kind = rng.choice(sorted(states))
        state = dict(states[kind])
        damage = rng.choice(("drop", "replace", "other_kind", "tensor"))
        if damage == "drop":
            key = rng.choice(sorted(k for k in state if k != "rank"))
            del state[key]
            expect = (key, "corrupted", "missing")
        elif damage == "replace":
            key = rng.choice(sorted(k for k in state if k not in ("rank", "integrity")))
            state[key] = rng.choice([v for v in (None, -1, "x", 2.5, [1]) if v != state[key]])
            expect = ("corrupted",)
        elif damage == "other_kind":
            other = rng.choice(sorted(k for k in states if k != kind))
            state = dict(states[other])
            expect = (f"saved by a {type(make_sampler(other, x)).__name__}",)
        else:
            key = "pending_plan"
            state[key] = [t.clone() for t in state[key]]
            t = rng.choice(state[key])
            t[rng.randrange(len(t))] += 1
            expect = ("corrupted",)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                make_sampler(kind, x).load_state_dict(state)
        except (ValueError, TypeError) as err:
            if not any(e in str(err) for e in expect):
                failures.append(f"{kind} state, {damage}: {type(err).__name__}: {err}")
        except Exception as err:  # noqa: BLE001
            failures.append(f"{kind} state, {damage}: {type(err).__name__}: {err}")
        else:
            failures.append(f"{kind} state, {damage}: loaded")
    return count + count // 2, failures


def _state(sampler) -> dict:
    it = iter(sampler)
    for _ in range(4):
        next(it)
    return sampler.state_dict(consumed=2)


# -- losses ------------------------------------------------------------------------------------

LOSS_BAD = {
    "temperature": [0, -1.0, float("nan"), float("inf"), "0.5", None,
                    torch.tensor(0.5, requires_grad=True)],
    "tau_plus": [1.0, -0.1, "0.1", float("nan")],
    "beta": [-1.0, float("nan"), "1"],
    "hardest": [-1, 1.5, "4"],
    "synthetic": [-1, 2.5, "2"],
    "generator": [123, "seed", np.random.default_rng(0), 1.5],
    "form": ["x", 3, None],
    "reduction": ["avg", None, 1],
    "labels": [torch.zeros(5), torch.zeros(8, 2), [0] * 8, torch.full((8,), float("nan"))],
    "negatives": [torch.randn(4, 3), torch.randn(4), torch.zeros(4, 4, dtype=torch.long)],
    "false_negatives": [torch.zeros(8, 8), torch.zeros(8, 7, dtype=torch.bool), "mask"],
    "anchor": [torch.randn(8), torch.zeros(8, 4, dtype=torch.long), torch.randn(7, 4),
               torch.full((8, 4), float("nan"))],
    "positive": [torch.randn(8), torch.randn(8, 5), torch.randn(4)],
}
LOSSES = {
    "info_nce": (hb.info_nce, ("temperature", "form", "reduction", "labels", "negatives",
                               "false_negatives", "anchor", "positive")),
    "debiased_info_nce": (hb.debiased_info_nce, ("temperature", "tau_plus", "labels",
                                                 "anchor", "negatives")),
    "hard_negative_info_nce": (hb.hard_negative_info_nce, ("temperature", "tau_plus", "beta",
                                                           "false_negatives", "positive")),
    "sscl_loss": (hb.sscl_loss, ("temperature", "hardest", "synthetic", "generator", "tau_plus",
                                 "beta", "labels", "anchor")),
    "InfoNCE": (hb.InfoNCE, ("temperature", "form", "reduction", "labels", "anchor")),
    "DebiasedInfoNCE": (hb.DebiasedInfoNCE, ("temperature", "tau_plus", "negatives")),
    "HardNegativeInfoNCE": (hb.HardNegativeInfoNCE, ("tau_plus", "beta", "false_negatives")),
    "SSCLLoss": (hb.SSCLLoss, ("hardest", "synthetic", "generator", "temperature", "positive")),
}
INPUTS = ("anchor", "positive", "labels", "negatives", "false_negatives")


def loss_cases(rng: random.Random, count: int) -> tuple[int, list[str]]:
    failures = []
    a, p = torch.randn(8, 4), torch.randn(8, 4)
    for _ in range(count):
        name = rng.choice(sorted(LOSSES))
        fn, args = LOSSES[name]
        arg = rng.choice(args)
        value = rng.choice(LOSS_BAD[arg])
        inputs = {"anchor": a, "positive": p}
        options = {}
        (inputs if arg in INPUTS else options)[arg] = value
        try:
            if name[0].isupper():  # a module: options at construction, inputs per call
                fn(**options)(inputs.pop("anchor"), inputs.pop("positive"), **inputs)
            else:
                fn(inputs.pop("anchor"), inputs.pop("positive"), **inputs, **options)
        except Exception as err:  # noqa: BLE001
            if not names(err, arg):
                failures.append(f"{name}({arg}={value!r:.30}): {type(err).__name__}: {err}")
        else:
            failures.append(f"{name}({arg}={value!r:.30}): accepted")
    return count, failures


# -- resume ------------------------------------------------------------------------------------

def reload(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def resume_cases(rng: random.Random, x, count: int) -> tuple[int, list[str]]:
    failures = []
    for _ in range(count):
        kind = rng.choice(sorted(SAMPLER_ARGS))
        kw = {"seed": rng.randrange(1000)}
        if kind != "uniform":
            kw["refresh_lag"] = rng.choice([0, 1])
            if kind != "gcbs":
                kw["refresh_every"] = rng.choice([2, 3, 5, None])
                kw["refresh_lag"] = 0 if kw["refresh_every"] in (None, 2) else kw["refresh_lag"]
        ref = make_sampler(kind, x, **kw)
        reference = [list(ref), list(ref)]
        steps = len(reference[0])
        cut = rng.randrange(steps)
        lag = rng.randrange(min(cut, 4) + 1)
        s = make_sampler(kind, x, **kw)
        it = iter(s)
        for _ in range(cut):
            next(it)
        state = reload(s.state_dict(consumed=cut - lag))
        fresh = make_sampler(kind, x, **kw)
        fresh.load_state_dict(state)
        got = [list(fresh), list(fresh)]
        if got[0] != reference[0][cut - lag:] or got[1] != reference[1]:
            failures.append(f"{kind} {kw} cut={cut} lag={lag}: other batches after resume")
    return count, failures


# -- corrupted checkpoints ---------------------------------------------------------------------

def small_trainer(path, **config):
    from hardbatch.train import TrainConfig, Trainer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(D, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    data = torch.from_numpy(np.random.default_rng(0).standard_normal((96, D)).astype(np.float32))
    config = {"epochs": 1, "seed": 3, "progress": False, "probe_max_iter": 5,
              "checkpoint_path": str(path), **config}
    return Trainer(model, hb.InfoNCE(0.5), lambda bank: hb.ProximityGraphSampler(
        bank, 16, candidates=30, neighbors=6, refresh_every=2, seed=1), data,
        augment=lambda v, generator=None: v + 0.05 * torch.randn(v.shape, generator=generator),
        config=TrainConfig(**config))


def checkpoint_cases(rng: random.Random, folder: Path, in_data: int,
                     anywhere: int) -> tuple[dict, list[str]]:
    from hardbatch.train.checkpoint import read_checkpoint

    path = folder / "ck.pt"
    small_trainer(path, max_steps=3).fit()
    original = path.read_bytes()
    want = digest(torch.load(path, weights_only=True))
    spans = tensor_record_spans(path)
    total = sum(end - start for start, end in spans)
    figures = {"file_bytes": len(original), "tensor_records": len(spans),
               "tensor_bytes": total, "data_flips": in_data, "data_detected": 0,
               "any_flips": anywhere, "any_detected": 0, "any_same_content": 0}
    failures = []
    bad = folder / "flipped.pt"
    for i in range(in_data + anywhere):
        offset = (span_offset(spans, rng.randrange(total)) if i < in_data
                  else rng.randrange(len(original)))
        data = bytearray(original)
        data[offset] ^= rng.randrange(1, 256)
        bad.write_bytes(bytes(data))
        part = "data" if i < in_data else "any"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                state = read_checkpoint(bad)
        except ValueError as err:
            if "corrupted" in str(err) and str(bad) in str(err):
                figures[f"{part}_detected"] += 1
            else:
                failures.append(f"flip at byte {offset}: ValueError without 'corrupted': {err}")
        except Exception as err:  # noqa: BLE001
            failures.append(f"flip at byte {offset}: {type(err).__name__}: {err}")
        else:
            if part == "any" and digest(state) == want:
                figures["any_same_content"] += 1  # a byte nothing depends on (zip CRC, padding)
            else:
                failures.append(f"flip at byte {offset} ({part}): loaded changed content")
    return figures, failures


# -- a killed rank -----------------------------------------------------------------------------

def killed_rank() -> tuple[dict, list[str]]:
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        return {"skipped": "no torchrun"}, []
    cmd = [torchrun, "--standalone", "--nproc_per_node=2",
           str(REPO / "scripts" / "distributed_stall.py"), "kill", "--timeout", "30"]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"seconds": 120.0}, ["the surviving rank hung for 120 s"]
    text = out.stdout + out.stderr
    seconds = time.perf_counter() - t0
    raised = "rank 0: RuntimeError after" in text
    waited = float(text.split("rank 0: RuntimeError after")[1].split("s")[0]) if raised else None
    figures = {"job_seconds": round(seconds, 1), "rank0_waited_seconds": waited,
               "job_exit_code": out.returncode}
    failures = [] if raised and out.returncode != 0 else [f"rank 0 did not raise: {text[-300:]}"]
    return figures, failures


# -- the slow refresh of the issue -------------------------------------------------------------

def refresh_case(n: int) -> tuple[dict, list[str]]:
    from hardbatch.samplers.refresh import RefreshCostWarning

    x = np.random.default_rng(0).standard_normal((n, 32)).astype(np.float32)
    sampler = hb.ProximityGraphSampler(x, 32, neighbors=20, graph="knn", refresh_every=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = iter(sampler)
        t0 = time.perf_counter()
        for _ in range(5):
            next(it)
        per_batch = (time.perf_counter() - t0) / 5
    warned = [str(w.message) for w in caught if issubclass(w.category, RefreshCostWarning)]
    figures = {"n": n, "ms_per_batch": round(1e3 * per_batch, 1), "warnings": len(warned)}
    due = per_batch >= 0.05  # builds this slow must warn (fast ones, at small n, need not)
    ok = len(warned) == 1 if due else len(warned) <= 1
    return figures, [] if ok else [f"{len(warned)} refresh warnings at {per_batch:.3f} s/batch"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few cases of each part (seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--no-torchrun", action="store_true", help="skip the killed-rank part")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    x = np.random.default_rng(args.seed).standard_normal((N, D)).astype(np.float32)
    quick = args.quick
    report, failed = {"seed": args.seed, "quick": quick, "torch": torch.__version__,
                      "hardbatch": hb.__version__}, 0
    parts = [
        ("samplers", lambda: sampler_cases(rng, x, 20 if quick else 2000)),
        ("losses", lambda: loss_cases(rng, 20 if quick else 2000)),
        ("resume", lambda: resume_cases(rng, x, 4 if quick else 150)),
    ]
    for name, run in parts:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. refresh cost on a busy machine
            cases, failures = run()
        report[name] = {"cases": cases, "failed": len(failures),
                        "seconds": round(time.perf_counter() - t0, 1)}
        failed += _print(name, report[name], failures)
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        figures, failures = checkpoint_cases(rng, Path(folder), 10 if quick else 300,
                                             10 if quick else 300)
        figures["seconds"] = round(time.perf_counter() - t0, 1)
        report["checkpoint"] = figures
        failed += _print("checkpoint", figures, failures)
    if not (quick or args.no_torchrun):
        report["killed_rank"], failures = killed_rank()
        failed += _print("killed_rank", report["killed_rank"], failures)
    report["refresh"], failures = refresh_case(300 if quick else 5000)
    failed += _print("refresh", report["refresh"], failures)
    report["failed"] = failed
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'FAILED' if failed else 'ok'}: {failed} failing case(s)")
    return 1 if failed else 0


def _print(name: str, figures: dict, failures: list[str]) -> int:
    print(f"{name:12s} " + ", ".join(f"{k}={v}" for k, v in figures.items()), flush=True)
    for line in failures[:10]:
        print(f"  FAIL {line[:300]}")
    return len(failures)


if __name__ == "__main__":
    sys.exit(main())
