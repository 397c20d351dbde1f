"""End-to-end recipes (benchmarks reproducing papers' tables) built on hardbatch's samplers:
:mod:`.graphcl` (GraphCL on TU datasets), :mod:`.simcse` (unsupervised SimCSE, STS),
:mod:`.simclr` (SimCLR on CIFAR-10 / MNIST), :mod:`.codesearch` (docstring -> code retrieval);
``hardbatch bench NAME`` runs them."""
