"""SimCSE where the model still has something to learn: all-MiniLM-L6-v2 with its top ``L``
transformer layers re-initialised, the lower ``6 - L`` layers frozen and their output cached.

The construction (exactly reproducible from the seed):

* **Starting model**: the sentence-transformers all-MiniLM-L6-v2 (mean pooling, unit norm) with
  ``bert.encoder.layer[6 - L:]`` re-initialised by BERT's rule (transformers'
  ``BertPreTrainedModel._init_weights``): every ``nn.Linear`` weight ~ normal(0, 0.02)
  (``initializer_range``), its bias 0; every ``LayerNorm`` weight 1, bias 0. The normal draws
  come from ``torch.Generator().manual_seed(seed)``, module by module in ``named_modules()``
  order (:func:`reinit_top_layers`), so the same seed gives the same starting model in every arm.
* **Cache** (:class:`LowerCache`): the embeddings and the lower ``6 - L`` layers are run once,
  in eval mode (no dropout), over the training sentences tokenised with ``max_seq_length`` 32
  (padded to 32); their output hidden states are stored in float16 ``[N, 32, 384]`` with the
  attention mask. A training step then runs only the top ``L`` layers (train mode: dropout in
  those layers makes the two SimCSE views) on the cached rows. This deviates from SimCSE, where
  dropout acts in every layer and every layer is trained.
* **Encoding for the samplers** (:class:`CachedEncoder`): the top layers in eval mode over the
  cache, mean pooling, unit norm; it has ``encode(texts, ...)`` so the library's
  :func:`~hardbatch.integrations.sentence_transformers.hard_negative_batch_sampler`
  builds and refreshes every sampler (``default`` = sentence-transformers'
  ``NoDuplicatesBatchSampler``) on it unchanged.
* **Step** (:func:`train_partial`): batch ids -> cached rows (trimmed to the batch's longest
  sentence) -> the 2B rows (two copies of each sentence) through the top layers in train mode
  -> mean pooling -> InfoNCE in SimCSE form (:func:`hardbatch.losses.info_nce`,
  ``form="simcse"``, temperature 0.05: sentence-transformers' ``MultipleNegativesRankingLoss``
  with scale 20), optional guided false-negative mask (:func:`hardbatch.guided_mask`, guide =
  fixed embeddings given per sentence). AdamW (no weight decay), linear decay to 0, no
  warm-up. The dropout stream of step ``s`` is ``torch.manual_seed(seed * 1_000_003 + s)``, so
  two arms with the same seed draw the same dropout masks whenever their batches have the same
  shape.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["INIT_RULE", "CachedEncoder", "LowerCache", "bert_of", "reinit_top_layers",
           "simcse_loss", "top_forward", "train_partial"]

#: The re-initialisation rule, as recorded in every result.
INIT_RULE = ("transformers BertPreTrainedModel._init_weights: nn.Linear weight ~ normal(0, "
             "initializer_range = 0.02), bias 0; LayerNorm weight 1, bias 0; draws from "
             "torch.Generator().manual_seed(seed), modules in named_modules() order")


def bert_of(model) -> nn.Module:
    """The ``BertModel`` inside a sentence-transformers model (``model[0].auto_model``)."""
    bert = getattr(model[0], "auto_model", None) if hasattr(model, "__getitem__") else None
    bert = bert if bert is not None else model
    if not hasattr(bert, "encoder") or not hasattr(bert.encoder, "layer"):
        raise ValueError("model must be a BERT-style SentenceTransformer (model[0].auto_model "
                         "with encoder.layer)")
    return bert


def _check_layers(bert: nn.Module, layers: int) -> int:
    total = len(bert.encoder.layer)
    if not isinstance(layers, (int, np.integer)) or not 1 <= layers <= total:
        raise ValueError(f"reinit_layers={layers!r} must be an integer in [1, {total}] (the "
                         f"model has {total} transformer layers)")
    return int(layers)


@torch.no_grad()
def reinit_top_layers(model, layers: int, seed: int) -> list[nn.Module]:
    """Re-initialise the top ``layers`` transformer layers of ``model`` by :data:`INIT_RULE`;
    returns those layers (the trainable part)."""
    bert = bert_of(model)
    layers = _check_layers(bert, layers)
    std = float(getattr(bert.config, "initializer_range", 0.02))
    gen = torch.Generator().manual_seed(int(seed))
    top = list(bert.encoder.layer[len(bert.encoder.layer) - layers:])
    for layer in top:
        for _, mod in layer.named_modules():
            if isinstance(mod, nn.Linear):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=gen) * std)
                if mod.bias is not None:
                    mod.bias.zero_()
            elif isinstance(mod, nn.LayerNorm):
                mod.weight.fill_(1.0)
                mod.bias.zero_()
    return top


def _extended_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, T]`` 0/1 attention mask -> the additive ``[B, 1, 1, T]`` mask BERT layers take."""
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def top_forward(layers: Sequence[nn.Module], hidden: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
    """Run ``layers`` on ``hidden`` ``[B, T, d]`` (float) with ``mask`` ``[B, T]`` and mean-pool
    over the unmasked tokens: the sentence embeddings ``[B, d]`` (not normalised)."""
    ext = _extended_mask(mask, hidden.dtype)
    for layer in layers:
        out = layer(hidden, attention_mask=ext)
        hidden = out[0] if isinstance(out, tuple) else out
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


class LowerCache:
    """The frozen lower layers' output for ``texts``: ``hidden`` float16 ``[N, T, d]``,
    ``mask`` bool ``[N, T]`` (``T = max_seq_length``), rows in text order.

    Built by running the model's embeddings and its lower ``6 - layers`` transformer layers in
    eval mode (no dropout) on the tokenised texts (truncated / padded to ``max_seq_length``).
    """

    def __init__(self, model, texts: Sequence[str], layers: int, *, max_seq_length: int = 32,
                 batch_size: int = 256, dtype: torch.dtype = torch.float16) -> None:
        bert = bert_of(model)
        layers = _check_layers(bert, layers)
        lower = list(bert.encoder.layer[: len(bert.encoder.layer) - layers])
        tok = model.tokenizer
        self.texts = list(texts)
        n, t0, c0 = len(self.texts), time.perf_counter(), time.process_time()
        hidden_chunks, mask_chunks = [], []
        was = bert.training
        bert.eval()
        try:
            with torch.no_grad():
                for i in range(0, n, batch_size):
                    enc = tok(self.texts[i:i + batch_size], padding="max_length",
                              truncation=True, max_length=max_seq_length, return_tensors="pt")
                    h = bert.embeddings(input_ids=enc["input_ids"],
                                        token_type_ids=enc.get("token_type_ids"))
                    ext = _extended_mask(enc["attention_mask"], h.dtype)
                    for layer in lower:
                        out = layer(h, attention_mask=ext)
                        h = out[0] if isinstance(out, tuple) else out
                    hidden_chunks.append(h.to(dtype))
                    mask_chunks.append(enc["attention_mask"].bool())
        finally:
            bert.train(was)
        self.hidden = torch.cat(hidden_chunks)
        self.mask = torch.cat(mask_chunks)
        self.build_seconds = time.perf_counter() - t0
        self.build_cpu_seconds = time.process_time() - c0
        self.index = {t: i for i, t in reversed(list(enumerate(self.texts)))}

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def nbytes(self) -> int:
        return self.hidden.element_size() * self.hidden.nelement() + self.mask.nelement()

    def rows(self, ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 hidden states and mask of rows ``ids``, trimmed to their longest sentence."""
        ids = torch.as_tensor(ids, dtype=torch.long)
        mask = self.mask[ids]
        width = int(mask.sum(1).max())
        return self.hidden[ids, :width].float(), mask[:, :width]


class CachedEncoder:
    """A stand-in for the SentenceTransformer with ``encode``: texts -> unit embeddings from the
    top layers over the cache (eval mode); ``training`` / ``train`` follow the top layers.
    ``seconds`` / ``cpu_seconds`` / ``calls`` account the encoding passes (wall, process CPU)."""

    def __init__(self, cache: LowerCache, layers: Sequence[nn.Module]) -> None:
        self.cache, self.layers = cache, list(layers)
        self.seconds, self.cpu_seconds, self.calls = 0.0, 0.0, 0

    @property
    def training(self) -> bool:
        return self.layers[0].training

    def train(self, mode: bool = True) -> CachedEncoder:
        for layer in self.layers:
            layer.train(mode)
        return self

    @torch.no_grad()
    def encode_rows(self, ids, batch_size: int = 512) -> torch.Tensor:
        """Unit embeddings ``[len(ids), d]`` of cache rows ``ids`` (eval mode, float32)."""
        t0, c0, was = time.perf_counter(), time.process_time(), self.training
        self.train(False)
        try:
            ids = torch.as_tensor(ids, dtype=torch.long)
            out = [top_forward(self.layers, *self.cache.rows(ids[i:i + batch_size]))
                   for i in range(0, len(ids), batch_size)]
        finally:
            self.train(was)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.process_time() - c0
        self.calls += 1
        emb = torch.cat(out) if out else torch.zeros(0, self.cache.hidden.shape[-1])
        return torch.nn.functional.normalize(emb, dim=1)

    def encode(self, texts: Sequence[str], batch_size: int = 512, convert_to_tensor: bool = True,
               normalize_embeddings: bool = True, **_ignored) -> torch.Tensor:
        """Unit embeddings of ``texts`` (every text must be one of the cache's)."""
        try:
            ids = [self.cache.index[t] for t in texts]
        except KeyError as exc:
            raise ValueError(f"text {str(exc)[:60]} is not in the cache") from None
        return self.encode_rows(ids, max(batch_size, 512))


def simcse_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float,
                false_negatives: torch.Tensor | None = None) -> torch.Tensor:
    """Unsupervised SimCSE's loss: InfoNCE of view 1 against view 2 (B - 1 in-batch negatives
    each), cosine / ``temperature``; equals MultipleNegativesRankingLoss(scale=1/temperature)."""
    from hardbatch.losses import info_nce

    return info_nce(z1, z2, temperature=temperature, form="simcse",
                    false_negatives=false_negatives)


def _views(layers, hidden, mask, input_dropout: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The two dropout views ``[B, d]`` of the cached rows (one pass over the 2B copies);
    ``input_dropout`` > 0 also drops cached input features (a stand-in for the lower layers'
    dropout that the cache leaves out)."""
    both = torch.cat([hidden, hidden])
    if input_dropout > 0:
        both = torch.nn.functional.dropout(both, input_dropout, training=True)
    z = top_forward(layers, both, torch.cat([mask, mask]))
    return z[: len(hidden)], z[len(hidden):]


def step_seed(seed: int, step: int) -> int:
    """The dropout seed of training step ``step`` of a run with ``seed``."""
    return int(seed) * 1_000_003 + int(step)


@torch.no_grad()
def probe_loss(cache: LowerCache, layers: Sequence[nn.Module], batches: Sequence[Sequence[int]],
               temperature: float, seed: int = 0, input_dropout: float = 0.0) -> list[float]:
    """The SimCSE loss (dropout views: train mode, no update) of each of ``batches``."""
    was = layers[0].training
    for layer in layers:
        layer.train(True)
    try:
        out = []
        for s, b in enumerate(batches):
            torch.manual_seed(step_seed(seed, s))
            out.append(float(simcse_loss(*_views(layers, *cache.rows(b), input_dropout),
                                         temperature)))
    finally:
        for layer in layers:
            layer.train(was)
    return out


def train_partial(cache: LowerCache, layers: Sequence[nn.Module], batches, steps: int, *,
                  lr: float, temperature: float, seed: int,
                  guide: torch.Tensor | None = None, guide_margin: float = 0.1,
                  input_dropout: float = 0.0,
                  on_step: Callable[[int, float], None] | None = None) -> dict:
    """Train ``layers`` for ``steps`` steps on the batches of the iterable ``batches`` (lists of
    cache row ids; consumed lazily, so a sampler may re-encode between steps).

    ``guide``: optional fixed unit embeddings ``[N, d']`` of the sentences; then the loss masks
    in-batch candidates the guide finds within ``guide_margin`` of the anchor's own positive
    (:func:`hardbatch.guided_mask`; both views of a sentence have the same guide embedding).
    ``input_dropout``: dropout probability on the cached inputs of each view (default 0).
    Returns ``{"loss", "step_seconds" (wall), "step_cpu_seconds" (process CPU time: with one
    torch thread, the step's cost without the other jobs' share), "masked_fraction"}`` lists.
    """
    from hardbatch import guided_mask

    params = [p for layer in layers for p in layer.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / steps))
    for layer in layers:
        layer.train(True)
    trace: dict[str, list[float]] = {"loss": [], "step_seconds": [], "step_cpu_seconds": [],
                                     "masked_fraction": []}
    it = iter(batches)
    for step in range(steps):
        ids = next(it)
        t0, c0 = time.perf_counter(), time.process_time()
        mask = None
        if guide is not None:
            g = guide[torch.as_tensor(ids, dtype=torch.long)]
            mask = guided_mask(g, g, guide_margin)
            b = len(ids)
            trace["masked_fraction"].append(float(mask.sum()) / max(1, b * (b - 1)))
        torch.manual_seed(step_seed(seed, step))
        loss = simcse_loss(*_views(layers, *cache.rows(ids), input_dropout), temperature, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        trace["loss"].append(float(loss.detach()))
        trace["step_seconds"].append(time.perf_counter() - t0)
        trace["step_cpu_seconds"].append(time.process_time() - c0)
        if on_step is not None:
            on_step(step, float(loss))
    for layer in layers:
        layer.train(False)
    return trace
