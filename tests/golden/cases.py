"""Golden outputs: batches of every sampler and values / gradients of every loss.

Recorded once with the code before the package layout changed (issue 16) and kept as
``golden.pt``; ``test_golden.py`` recomputes every case and compares. Uses only public API
(``hardbatch.*``), so it survives moves of private code.

How to add or re-record cases without breaking other machines: ``README.md`` beside this file
(``python tests/golden/cases.py --add`` / ``--pin`` / ``--rewrite KEY``).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import numpy as np
import torch

import hardbatch as hb

FIXTURE = Path(__file__).with_name("golden.pt")
N, D, B = 300, 16, 32


def embeddings(seed: int = 0, n: int = N, d: int = D) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return torch.nn.functional.normalize(x, dim=1).float().numpy()


def _cat(batches) -> torch.Tensor:
    """A list of batches (lists of ints) as one int64 tensor: lengths, then the items."""
    lens = [len(b) for b in batches]
    flat = [v for b in batches for v in b]
    return torch.tensor([len(lens), *lens, *flat], dtype=torch.int64)


def _epochs(sampler, epochs: int = 2) -> torch.Tensor:
    out = []
    for e in range(epochs):
        sampler.set_epoch(e)
        out.extend(list(sampler))
    return _cat(out)


def _samplers(x: np.ndarray) -> dict:
    """Factories of every sampler configuration (fresh sampler per call)."""
    decay = hb.LinearDecay(0.2, 0.05)
    cfgs = {
        "uniform": lambda **kw: hb.UniformBatchSampler(N, B, **kw),
        "uniform_drop": lambda **kw: hb.UniformBatchSampler(N, B, drop_last=True, **kw),
        "knn": lambda **kw: hb.KNNBatchSampler(x, B, refresh_every=3, **kw),
        "prox_rwr": lambda **kw: hb.ProximityGraphSampler(
            x, B, candidates=100, neighbors=10, refresh_every=4, **kw),
        "prox_rwr_decay": lambda **kw: hb.ProximityGraphSampler(
            x, B, candidates=100, neighbors=10, restart=decay, epochs=2, refresh_every=4, **kw),
        "prox_rw": lambda **kw: hb.ProximityGraphSampler(
            x, B, candidates=100, neighbors=10, walk="rw", **kw),
        "prox_bfs": lambda **kw: hb.ProximityGraphSampler(
            x, B, candidates=100, neighbors=10, walk="bfs", **kw),
        "prox_dfs": lambda **kw: hb.ProximityGraphSampler(
            x, B, candidates=100, neighbors=10, walk="dfs", **kw),
        "prox_knn_graph": lambda **kw: hb.ProximityGraphSampler(
            x, B, neighbors=10, graph="knn", refresh_every=5, **kw),
        "prox_drop": lambda **kw: hb.ProximityGraphSampler(
            x, B, candidates=100, neighbors=10, drop_last=True, **kw),
        "gcbs_exact": lambda **kw: hb.GCBSSampler(x, B, quantile=0.98, **kw),
        "gcbs_ivf": lambda **kw: hb.GCBSSampler(x, B, quantile=0.98, method="ivf", nlist=8,
                                                **kw),
        "gcbs_partition": lambda **kw: hb.GCBSSampler(x, B, quantile=0.98,
                                                      method="partition", partitions=4, **kw),
        "gcbs_paired": lambda **kw: hb.GCBSSampler(x, B, quantile=0.98,
                                                   paired=embeddings(7), **kw),
        "gcbs_shuffle_drop": lambda **kw: hb.GCBSSampler(x, B, quantile=0.98,
                                                         shuffle_batches=True, drop_last=True,
                                                         **kw),
    }
    return cfgs


def _bank_run(make, steps: int = 25) -> torch.Tensor:
    """Batches of a sampler reading a bank that the 'training loop' writes every step."""
    bank = hb.EmbeddingBank(N, D, seed=3)
    sampler = make(bank)
    out = []
    step = 0
    for e in range(2):
        sampler.set_epoch(e)
        for batch in sampler:
            out.append(batch)
            gen = torch.Generator().manual_seed(1000 + step)
            bank.update(torch.tensor(batch), torch.randn(len(batch), D, generator=gen))
            step += 1
            if step >= steps:
                break
        if step >= steps:
            break
    return _cat(out)


def sampler_cases() -> dict[str, torch.Tensor]:
    x = embeddings(0)
    out: dict[str, torch.Tensor] = {}
    cfgs = _samplers(x)
    for name, make in cfgs.items():
        out[f"sampler/{name}/seed0"] = _epochs(make(seed=0))
        out[f"sampler/{name}/seed5"] = _epochs(make(seed=5), epochs=1)
        # resume mid-epoch (epoch 1, after 3 batches), the rest of the epoch
        s = make(seed=1)
        s.set_epoch(1)
        it = iter(s)
        head = [next(it) for _ in range(3)]
        state = s.state_dict()
        r = make(seed=1)
        r.load_state_dict(state)
        out[f"sampler/{name}/resume"] = _cat(head + list(r))
        for world in (2, 3):
            ranks = []
            for rank in range(world):
                ranks.extend(list(make(seed=2, rank=rank, world_size=world)))
            out[f"sampler/{name}/world{world}"] = _cat(ranks)
    # prefetching planner thread and pipelined / background refresh
    for name in ("knn", "prox_rwr", "prox_rwr_decay"):
        out[f"sampler/{name}/prefetch2"] = _epochs(cfgs[name](seed=0, prefetch=2))
    for name in ("prox_rwr", "prox_knn_graph", "gcbs_exact"):
        out[f"sampler/{name}/lag1"] = _epochs(cfgs[name](seed=0, refresh_lag=1))
        out[f"sampler/{name}/background"] = _epochs(cfgs[name](seed=0, background=True))
    # live banks: refresh reads what the loop wrote
    live = {
        "knn": lambda bank, **kw: hb.KNNBatchSampler(bank, B, refresh_every=3, **kw),
        "prox_rwr": lambda bank, **kw: hb.ProximityGraphSampler(
            bank, B, candidates=100, neighbors=10, refresh_every=4, **kw),
        "gcbs": lambda bank, **kw: hb.GCBSSampler(bank, B, quantile=0.98, **kw),
    }
    for name, make in live.items():
        out[f"bank/{name}"] = _bank_run(lambda bank: make(bank, seed=0))
        out[f"bank/{name}/lag1"] = _bank_run(lambda bank: make(bank, seed=0, refresh_lag=1))
        if name != "knn":  # the kNN sampler's snapshot is a copy: no background build
            out[f"bank/{name}/background"] = _bank_run(
                lambda bank: make(bank, seed=0, background=True))
    out["bank/knn/prefetch2"] = _bank_run(lambda bank: live["knn"](bank, seed=0, prefetch=2))
    out["bank/prox_rwr/prefetch2_background"] = _bank_run(
        lambda bank: live["prox_rwr"](bank, seed=0, prefetch=2, background=True))
    out.update(source_cases(x, cfgs))
    # the functional core
    out["fn/proximity_graph"] = hb.proximity_graph(x, 100, 10, seed=4)
    out["fn/proximity_graph_g5"] = hb.proximity_graph(x, 100, 10, seed=4, group_size=5)
    out["fn/knn_graph"] = hb.knn_graph(x, 10)
    graph = hb.knn_graph(x, 10)
    for walk in ("rwr", "rw", "bfs", "dfs"):
        out[f"fn/walk_batches/{walk}"] = hb.walk_batches(graph, B, 5, walk=walk, seed=9)
    for method in ("exact", "ivf", "partition"):
        # min_partners=0: the paper's graph, the only one before issue 22 (the default is now 16)
        out[f"fn/gcbs_permutation/{method}"] = hb.gcbs_permutation(x, 0.98, method=method,
                                                                   seed=2, min_partners=0)
    return out


def _encoder(x: np.ndarray, dtype=torch.float32):
    """A callable source whose k-th call returns ``x`` turned a little further (a new encoding)."""
    calls = []

    def encode() -> torch.Tensor:
        calls.append(1)
        t = torch.from_numpy(x).to(dtype)
        return t + 0.05 * len(calls) * t.roll(1, dims=1)
    return encode


def source_cases(x: np.ndarray, cfgs: dict) -> dict[str, torch.Tensor]:
    """Sources and options the refresh path reads: callables, unnormalised rows (float64
    tensors, rows scaled by 1e-3 .. 1e3), ``normalize=False``, ranks of one global batch,
    duplicate keys and a paired callable."""
    gen = torch.Generator().manual_seed(5)
    raw = torch.from_numpy(x).double() * 10.0 ** torch.randint(-3, 4, (N, 1), generator=gen)
    raw = raw + 0.01 * torch.randn(N, D, generator=gen, dtype=torch.float64)
    prox = dict(candidates=100, neighbors=10, refresh_every=4)
    makers = {
        "knn": lambda src, **kw: hb.KNNBatchSampler(src, B, refresh_every=3, **kw),
        "prox_rwr": lambda src, **kw: hb.ProximityGraphSampler(src, B, **prox, **kw),
        "prox_knn_graph": lambda src, **kw: hb.ProximityGraphSampler(
            src, B, neighbors=10, graph="knn", refresh_every=5, **kw),
        "gcbs_exact": lambda src, **kw: hb.GCBSSampler(src, B, quantile=0.98, **kw),
    }
    out: dict[str, torch.Tensor] = {}
    for name, make in makers.items():
        out[f"source/{name}/callable"] = _epochs(make(_encoder(x), seed=0))
        out[f"source/{name}/raw_float64"] = _epochs(make(raw, seed=0))
        if name != "gcbs_exact":
            out[f"source/{name}/raw_unnormalized"] = _epochs(make(raw.float(), seed=0,
                                                                  normalize=False))
            out[f"bank/{name}/unnormalized"] = _bank_run(lambda bank: make(bank, seed=0,
                                                                           normalize=False))
    out["bank/prox_knn_graph"] = _bank_run(lambda bank: makers["prox_knn_graph"](bank, seed=0))
    out["bank/gcbs/paired_callable"] = _bank_run(lambda bank: makers["gcbs_exact"](
        bank, seed=0, paired=_encoder(embeddings(7))))
    keys = [i % 250 for i in range(N)]  # 50 keys held by two items
    for name in ("uniform", "knn", "prox_rwr", "gcbs_exact"):
        out[f"sampler/{name}/keys"] = _epochs(cfgs[name](seed=0, duplicate_keys=keys))
        ranks = [cfgs[name](seed=0, rank=r, world_size=3, global_batch=True) for r in range(3)]
        out[f"sampler/{name}/global_batch3"] = _cat([b for r in ranks for b in r])
    out["sampler/prox_rwr/global_batch2_prefetch2"] = _cat([b for r in range(2) for b in cfgs[
        "prox_rwr"](seed=0, rank=r, world_size=2, global_batch=True, prefetch=2)])
    return out


def _views(seed: int, b: int = 12, d: int = 8, m: int = 5):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(b, d, generator=gen, dtype=torch.float64)
    p = a + 0.5 * torch.randn(b, d, generator=gen, dtype=torch.float64)
    neg = torch.randn(m, d, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 4, (b,), generator=gen)
    return a, p, neg, labels


def _loss_and_grads(fn, a, p, neg, **kw) -> dict[str, torch.Tensor]:
    a, p = a.clone().requires_grad_(), p.clone().requires_grad_()
    if neg is not None:
        neg = neg.clone().requires_grad_()
        kw["negatives"] = neg
    value = fn(a, p, **kw)
    total = value.sum() if value.dim() else value
    grads = torch.autograd.grad(total, [a, p] + ([neg] if neg is not None else []))
    out = {"value": value.detach()}
    for name, g in zip(("grad_anchor", "grad_positive", "grad_negatives"), grads):
        out[name] = g
    return out


def loss_cases() -> dict[str, torch.Tensor]:
    a, p, neg, labels = _views(0)
    fns = {
        "info_nce": (hb.info_nce, {}),
        "debiased": (hb.debiased_info_nce, {"tau_plus": 0.1}),
        "hard_negative": (hb.hard_negative_info_nce, {"tau_plus": 0.1, "beta": 1.0}),
        "hard_negative_detach": (hb.hard_negative_info_nce,
                                 {"tau_plus": 0.05, "beta": 0.5, "detach_weights": True}),
        "sscl": (hb.sscl_loss, {"hardest": 6, "synthetic": 4}),
        "sscl_nomix": (hb.sscl_loss, {"hardest": 6, "synthetic": 4, "mix": False}),
        "sscl_detach": (hb.sscl_loss, {"hardest": 6, "synthetic": 4, "detach_weights": True,
                                       "detach_synthetic": True}),
    }
    out: dict[str, torch.Tensor] = {}
    for name, (fn, kw) in fns.items():
        for form in ("simclr", "simcse"):
            for variant, extra, use_neg in (("plain", {}, False),
                                            ("labels", {"labels": labels}, False),
                                            ("negatives", {}, True),
                                            ("none_t01", {"reduction": "none",
                                                          "temperature": 0.1}, False),
                                            ("raw_sum", {"normalize": False,
                                                         "reduction": "sum"}, False)):
                kw2 = dict(kw, form=form, **extra)
                if name.startswith("sscl"):
                    kw2["generator"] = torch.Generator().manual_seed(11)
                res = _loss_and_grads(fn, a, p, neg if use_neg else None, **kw2)
                for key, val in res.items():
                    out[f"loss/{name}/{form}/{variant}/{key}"] = val
    modules = {
        "InfoNCE": hb.InfoNCE(temperature=0.2, form="simcse"),
        "DebiasedInfoNCE": hb.DebiasedInfoNCE(temperature=0.5, tau_plus=0.05),
        "HardNegativeInfoNCE": hb.HardNegativeInfoNCE(temperature=0.5, tau_plus=0.05, beta=0.5),
        "SSCLLoss": hb.SSCLLoss(temperature=0.5, hardest=6, synthetic=4,
                               generator=torch.Generator().manual_seed(3)),
    }
    for name, mod in modules.items():
        res = _loss_and_grads(lambda x, y, **kw: mod(x, y, **kw), a, p, None)
        for key, val in res.items():
            out[f"module/{name}/{key}"] = val
        out[f"module/{name}/repr"] = torch.tensor(list(repr(mod).encode()), dtype=torch.uint8)
    # half precision inputs
    for name, fn in (("info_nce", hb.info_nce), ("debiased", hb.debiased_info_nce)):
        for dtype in (torch.bfloat16, torch.float16):
            out[f"half/{name}/{dtype}"] = fn(a.to(dtype), p.to(dtype), temperature=0.05,
                                             form="simcse")
    frac, bound = hb.debiased_floor_stats(a, p, temperature=0.05, tau_plus=0.1)
    out["floor_stats"] = torch.tensor([float(frac), float(bound)], dtype=torch.float64)
    return out


def loss_option_cases() -> dict[str, torch.Tensor]:
    """The options and inputs every loss takes beyond ``loss_cases`` (issue 30): guided and
    labelled masks, a row left without negatives, ``reduction="sum"``, ``gather=True`` without a
    process group, NumPy hyperparameters, the modules' options and per-batch inputs, the
    general ``contrastive_loss``, the floor statistics, autocast and half precision."""
    import warnings

    from hardbatch.losses.functional import contrastive_loss

    a, p, neg, labels = _views(0)
    ga, gp, _, _ = _views(1)
    out: dict[str, torch.Tensor] = {}
    for form in ("simclr", "simcse"):
        guided = hb.guided_mask(a + 0.3 * ga, p + 0.3 * gp, 0.5, form=form)
        out[f"mask/guided/{form}"] = guided
        full_row = torch.zeros(12, 12, dtype=torch.bool)
        full_row[0] = True
        fns = {"info_nce": (hb.info_nce, {}),
               "debiased": (hb.debiased_info_nce, {"tau_plus": 0.1}),
               "hard_negative": (hb.hard_negative_info_nce, {"beta": 0.5}),
               "sscl": (hb.sscl_loss, {"hardest": 6, "synthetic": 4})}
        for name, (fn, kw) in fns.items():
            for variant, extra, use_neg in (
                    ("guided", {"false_negatives": guided}, False),
                    ("labels_guided_none", {"labels": labels, "false_negatives": guided,
                                            "reduction": "none"}, True),
                    ("full_row", {"false_negatives": full_row}, False),
                    ("sum", {"reduction": "sum"}, True),
                    ("gather_noop", {"gather": True}, False),
                    ("numpy_t", {"temperature": np.float32(0.25)}, False)):
                kw2 = dict(kw, form=form, **extra)
                if name == "sscl":
                    kw2["generator"] = torch.Generator().manual_seed(11)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    res = _loss_and_grads(fn, a, p, neg if use_neg else None, **kw2)
                for key, val in res.items():
                    out[f"loss/{name}/{form}/{variant}/{key}"] = val
        modules = {
            "InfoNCE": hb.InfoNCE(0.3, form, reduction="sum"),
            "DebiasedInfoNCE": hb.DebiasedInfoNCE(0.5, 0.05, form=form, reduction="none"),
            "HardNegativeInfoNCE": hb.HardNegativeInfoNCE(0.5, 0.1, 0.7, form=form,
                                                          detach_weights=True),
            "SSCLLoss": hb.SSCLLoss(0.5, 0.05, 1.5, 5, 3, False, form=form, normalize=False,
                                    generator=torch.Generator().manual_seed(4)),
        }
        for name, mod in modules.items():
            res = _loss_and_grads(lambda x, y, mod=mod, **kw: mod(x, y, labels, **kw), a, p, neg,
                                  false_negatives=guided)
            for key, val in res.items():
                out[f"module/{name}/{form}/inputs/{key}"] = val
            if hasattr(mod, "floor_fraction"):
                out[f"module/{name}/{form}/floor_fraction"] = torch.tensor(
                    mod.floor_fraction, dtype=torch.float64)
        for tag, kw in (("beta_labels", {"beta": 0.5, "labels": labels}),
                        ("guided_raw", {"false_negatives": guided, "normalize": False}),
                        ("negatives", {"negatives": neg, "tau_plus": 0.3})):
            frac, bound = hb.debiased_floor_stats(a, p, temperature=0.2, form=form, **kw)
            out[f"floor_stats/{form}/{tag}"] = torch.tensor([frac, bound], dtype=torch.float64)
        for tag, kw in (("tau0_raw", {"tau_plus": 0.0, "normalize": False}),
                        ("beta_only", {"beta": 0.8}),
                        ("synthetic_only", {"hardest": 4, "synthetic": 3,
                                            "generator": torch.Generator().manual_seed(2)})):
            res = _loss_and_grads(contrastive_loss, a, p, None, form=form, **kw)
            for key, val in res.items():
                out[f"contrastive/{form}/{tag}/{key}"] = val
    a32, p32 = a.float(), p.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out["autocast/info_nce"] = hb.info_nce(a32, p32, temperature=0.05, form="simcse")
        out["autocast/sscl"] = hb.sscl_loss(a32, p32, hardest=6, synthetic=4,
                                            generator=torch.Generator().manual_seed(1))
    for name, fn in (("hard_negative", hb.hard_negative_info_nce), ("sscl", hb.sscl_loss)):
        kw = {"generator": torch.Generator().manual_seed(1)} if name == "sscl" else {}
        out[f"half/{name}/torch.float16"] = fn(a.half(), p.half(), temperature=0.1, **kw)
    return out


def all_cases() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {**sampler_cases(), **loss_cases(), **loss_option_cases()}


# CPU flags that select different vectorised kernels in torch, MKL, oneDNN or OpenBLAS
KERNEL_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
                "asimd", "sve", "sve2")
# environment variables that change which kernels run
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE",
              "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                if out:
                    break
                continue
            key, _, value = line.partition(":")
            out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return out


def _torch_blas() -> str:
    for line in torch.__config__.show().splitlines():
        if "Math Kernel Library Version" in line:
            return "mkl " + line.split("Version", 1)[1].split("-")[0].strip()
    return "mkl" if torch.backends.mkl.is_available() else "blas ?"


def _numpy_blas() -> str:
    """NumPy's BLAS, its version and the core type it dispatched to at run time."""
    try:
        from threadpoolctl import threadpool_info
        for lib in threadpool_info():
            if lib.get("user_api") == "blas" and "numpy" in str(lib.get("filepath", "")):
                return f"{lib.get('internal_api')} {lib.get('version')} {lib.get('architecture')}"
    except Exception:  # threadpoolctl absent or failing: the build's record
        pass
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    return f"{blas.get('name', '?')} {blas.get('version', '?')}"


def machine() -> str:
    """The key of the kernels a float result depends on: the processor (vendor, family, model:
    every EPYC generation says "AMD EPYC" in its name), the CPU capability torch dispatches to,
    torch's and NumPy's BLAS (with the core type OpenBLAS picked), the CPU flags that change
    kernels, the environment variables that override them, and the library versions. Two
    machines with the same key run the same kernels, so their floats are compared bit for bit."""
    info = _cpuinfo()
    cpu = "/".join(info.get(k, "?") for k in ("vendor_id", "cpu family", "model"))
    flags = set((info.get("flags") or info.get("Features") or "").split())
    kernel_flags = ",".join(f for f in KERNEL_FLAGS if f in flags)
    env = ",".join(f"{k}={os.environ[k]}" for k in KERNEL_ENV if k in os.environ)
    return "|".join([
        platform.machine(), cpu, info.get("model name", "?"),
        f"cap {torch.backends.cpu.get_cpu_capability()}", f"torch blas {_torch_blas()}",
        f"numpy blas {_numpy_blas()}", f"flags {kernel_flags}", f"env {env}",
        f"threads {torch.get_num_threads()}",
        f"torch {torch.__version__}", f"numpy {np.__version__}"])


def tolerance(want: torch.Tensor) -> float:
    """The tolerance of a float case on a machine whose kernels differ from the recording's:
    1e-12 for float64, 1e-6 (relative and absolute) for float32 and half inputs (computed in
    float32). A change of formula moves values by far more."""
    return 1e-12 if want.dtype == torch.float64 else 1e-6


def compare(key: str, got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor | None = None
            ) -> None:
    """Raise when ``got`` differs from the recorded ``want``: integers and booleans bit for bit;
    floats within :func:`tolerance` of the first recording and, where ``exact`` holds this
    machine kind's own values (``--pin``), bit for bit to those."""
    assert got.dtype == want.dtype and got.shape == want.shape, (key, got.dtype, got.shape)
    if not want.is_floating_point():
        assert torch.equal(got, want), key
        return
    tol = tolerance(want)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m: f"{key}: {m}")
    if exact is not None:
        assert torch.equal(got, exact), f"{key}: not bit-identical to the values pinned on {machine()}"


def load() -> dict:
    """The fixture: ``cases`` (the reference values), ``recorded_on`` (per case, the machine key
    that recorded it; keys of the old format are kept as they were) and ``exact`` (per machine
    key, the float values pinned there, compared bit for bit on that kind only)."""
    data = torch.load(FIXTURE, weights_only=True)
    recorded = {k: data.get("recorded_on", {}).get(k, data.get("machine", "?"))
                for k in data["cases"]}
    return {"format": 2, "cases": data["cases"], "recorded_on": recorded,
            "exact": data.get("exact", {})}


def save(data: dict) -> None:
    tmp = FIXTURE.with_suffix(".tmp")
    torch.save(data, tmp)
    os.replace(tmp, FIXTURE)


USAGE = """usage: python tests/golden/cases.py COMMAND
  --add           record the cases that the fixture lacks (new cases) on this machine; the
                  recorded cases must still match (else nothing is written)
  --pin           keep this machine kind's float values for bit-for-bit comparison here
                  (every case must first match its reference within tolerance)
  --rewrite KEY.. re-record the named cases (prefixes allowed) because their behaviour is meant
                  to change; their pins on other machine kinds are dropped
  --write         re-record every case from scratch (a change of behaviour everywhere)"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("--add", "--pin", "--rewrite", "--write"):
        print(USAGE)
        return 2
    here, cases = machine(), all_cases()
    if argv[0] == "--write":
        data = {"format": 2, "cases": cases, "recorded_on": dict.fromkeys(cases, here),
                "exact": {}}
        save(data)
        print(f"wrote {len(cases)} cases recorded on {here}")
        return 0
    data = load()
    rewrite = [k for k in cases if any(k.startswith(p) for p in argv[1:])] \
        if argv[0] == "--rewrite" else []
    if argv[0] == "--rewrite" and not rewrite:
        print(f"--rewrite {' '.join(argv[1:])}: no case starts with that; see the case names "
              "with --add's listing")
        return 2
    bad = []
    for key, got in cases.items():
        if key in data["cases"] and key not in rewrite:
            try:
                compare(key, got, data["cases"][key])
            except AssertionError as err:
                bad.append(f"{key}: {str(err).splitlines()[0]}")
    if bad:
        print(f"{len(bad)} recorded case(s) changed; nothing written (use --rewrite KEY if the "
              "change is meant):\n  " + "\n  ".join(bad[:20]))
        return 1
    stale = sorted(set(data["cases"]) - set(cases))
    for key in stale:
        data["cases"].pop(key)
        data["recorded_on"].pop(key)
    new = [k for k in cases if k not in data["cases"]] + rewrite
    for key in new:
        data["cases"][key], data["recorded_on"][key] = cases[key], here
        for pins in data["exact"].values():
            pins.pop(key, None)
    floats = new if argv[0] != "--pin" else list(cases)
    pins = data["exact"].setdefault(here, {})
    pins.update({k: cases[k] for k in floats if cases[k].is_floating_point()})
    if not pins:
        data["exact"].pop(here)
    save(data)
    print(f"{len(new)} case(s) recorded, {len(stale)} removed, {len(pins)} float case(s) pinned "
          f"for {here}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
