"""hardbatch_experiments: the papers' experiments built on the ``hardbatch`` library.

The library never imports this package; its commands reach ``hardbatch`` as plugins
(entry-point group ``hardbatch.commands``, see :mod:`hardbatch.cli`).

* :mod:`.cli`: ``hardbatch demo``, ``hardbatch bench graphcl|simcse|simclr``,
  ``hardbatch eval sts``;
* :mod:`.demo`: every sampler on scikit-learn's digits, compared;
* :mod:`.recipes`: GraphCL, SimCSE and SimCLR benchmark recipes; :mod:`.runs`: their run
  bookkeeping (one JSON per run, locks, skipping finished runs);
* :mod:`.factories`: the samplers and losses they build through :mod:`hardbatch.registry`;
* :mod:`.datasets` (digits, MNIST, CIFAR-10), :mod:`.tu` (TU graph datasets),
  :mod:`.vision` (image views, ConvNet / ResNet encoders), :mod:`.sts` (STS evaluation);
* :mod:`.reports`: the result pages under ``docs/results/``.
"""
