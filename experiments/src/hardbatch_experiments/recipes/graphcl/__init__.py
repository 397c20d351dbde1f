"""GraphCL on TU datasets with hardbatch's samplers and losses (BatchSampler paper, Table 3 / E.2).

One run = (dataset, sampler, loss, seed): train GraphCL (You et al. 2020, unsupervised TU setting)
with batches from the chosen sampler, embed every graph with the frozen encoder (the 96-d
concatenated sum-pooled readout of a 3-layer GIN), and score the embeddings with an RBF SVM
(C chosen by 5-fold inner CV over 1e-3..1e3) under 10-fold stratified CV, as GraphCL's
``evaluate_embedding``. Each run writes one JSON (atomically); an existing JSON means the run is
done and is skipped, so a grid can be completed in pieces.

Model and training follow GraphCL's ``unsupervised_TU`` code: GIN layers
``relu(GINConv(MLP)) -> BatchNorm``, hidden 32, sum pooling of every layer, concatenated (96-d);
projection head ``Linear-ReLU-Linear`` (96-96-96); Xavier-uniform init; Adam lr 0.01;
temperature 0.2. Views (``--views``): ``orig+aug`` (default, GraphCL's released code: the anchor
is the original graph, the positive one augmentation drawn per graph from the four) or
``aug+aug`` (both views augmented independently, the paper's description). Augmentations
(``--aug-style paper``, default) follow the GraphCL paper's description at ratio 0.2: node
dropping, edge perturbation (removal of undirected edges, as the released code only removes),
attribute masking with N(0.5, 0.5) noise (the released code's), subgraph = random expansion
keeping 80% of the nodes; applied to a whole collated batch at once (:func:`augment`).
``--aug-style released`` reproduces the released ``unsupervised_TU`` code instead, which differs
(:func:`augment_released`: 10% ratios, node dropping that keeps only the chosen nodes' edges, a
subgraph that removes the start node's neighbourhood, self-loops on the anchor and evaluated
graphs).

Samplers read an :class:`hardbatch.EmbeddingBank` of the anchor view's readout, updated (detached)
at every training step. The bank starts from one encoding pass of the untrained encoder
(``--bank-init encode``, like the initial ``get_embeddings`` of GraphCL's script), so the first
graph of a sampler is built from real (if untrained) embeddings; ``--bank-init random`` keeps the
bank's random init.

How the hard samplers are fed (issue 18; :mod:`.sampling`, defaults = the runs above):
``--sampler-space readout | projection | centred-readout`` (what the bank stores and the graph
is built from), ``--warmup-epochs w`` (uniform epochs first, then the bank is re-encoded),
``--alpha-schedule linear | per-epoch`` (the authors' max(0.05, 0.2 - 0.02 * epoch)) and
``--epoch-mode steps | coverage`` (walk until every graph is covered, the run capped at the
uniform step budget). They apply to the non-uniform samplers only and enter their run tag, so
one uniform run per seed is the baseline of every configuration.

Samplers and losses come from :mod:`hardbatch.registry` (``--sampler`` / ``--loss``: its names,
comma-separated, or ``all``). The views come from the library,
:mod:`hardbatch.integrations.pyg_augment` (re-exported here). Modules: :mod:`.model` (GIN encoder,
projection head), :mod:`.evaluation` (SVM), :mod:`.run` (one run, the paper's settings),
:mod:`.cli` (``hardbatch bench graphcl``, the grid).

Usage::

    hardbatch bench graphcl --dataset MUTAG --sampler all --loss infonce --seeds 5 \
        --out results/graphs/
"""

from hardbatch.integrations.pyg_augment import AUGS, augment, augment_released, released_self_loops

from ...factories import gcbs_quantile
from .cli import add_graphcl_parser, build_parser, main, run_graphcl
from .evaluation import C_GRID, evaluate_embeddings
from .model import GINEncoder, GraphCL, embed_all
from .run import DEFAULTS, Hyper, hyper_for, result_path, run_one, run_tag

__all__ = [
    "AUGS",
    "C_GRID",
    "DEFAULTS",
    "GINEncoder",
    "GraphCL",
    "Hyper",
    "add_graphcl_parser",
    "augment",
    "augment_released",
    "build_parser",
    "embed_all",
    "evaluate_embeddings",
    "gcbs_quantile",
    "hyper_for",
    "main",
    "released_self_loops",
    "result_path",
    "run_graphcl",
    "run_one",
    "run_tag",
]
