"""Samplers and losses of the demo and the recipes, built through :mod:`hardbatch.registry`.

A recipe holds one set of settings (seed, graph sizes, refresh interval, temperature,
``tau_plus`` ...); each sampler and loss takes the settings listed for it here, so that every
recipe builds, say, the proximity sampler from the same options::

    sampler = make_sampler("proximity", bank, 256, seed=0, candidates=500, neighbors=100,
                           restart=LinearDecay(0.2, 0.05), refresh_every=100, epochs=10,
                           quantile=0.999)     # quantile is GCBS's: not passed here
    loss = make_loss("debiased", 0.5, tau_plus=0.1, beta=1.0)   # DebiasedInfoNCE(0.5, 0.1)
"""

from __future__ import annotations

from torch import nn

from hardbatch import registry

__all__ = ["LOSS_SETTINGS", "SAMPLER_SETTINGS", "gcbs_quantile", "make_loss", "make_sampler"]

#: The recipe settings each sampler takes (besides the source and the batch size).
SAMPLER_SETTINGS: dict[str, tuple[str, ...]] = {
    "uniform": ("seed",),
    "knn": ("refresh_every", "seed"),
    "proximity": ("candidates", "neighbors", "restart", "refresh_every", "epochs", "seed"),
    "gcbs": ("quantile", "seed"),
    "cluster": ("seed",),
    "community": ("seed",),
}
#: The recipe settings each loss takes (besides the temperature and ``form``).
LOSS_SETTINGS: dict[str, tuple[str, ...]] = {
    "infonce": (),
    "dcl": ("tau_plus",),
    "hcl": ("tau_plus", "beta"),
    "sscl": ("tau_plus", "beta", "generator"),
}


def make_sampler(name: str, source, batch_size: int, **settings):
    """The sampler ``name`` over ``source`` with the ``settings`` of :data:`SAMPLER_SETTINGS`
    for it (all of them must be given; the others are ignored)."""
    name = registry.canonical_sampler(name)
    return registry.make_sampler(name, source, batch_size,
                                 **{key: settings[key] for key in SAMPLER_SETTINGS[name]})


def make_loss(name: str, temperature: float, *, form: str | None = None,
              **settings) -> nn.Module:
    """The loss ``name`` (aliases accepted) at ``temperature`` with the ``settings`` of
    :data:`LOSS_SETTINGS` it takes (missing ones keep the loss's default); ``form`` if given."""
    name = registry.canonical_loss(name)
    options = {key: settings[key] for key in LOSS_SETTINGS[name] if key in settings}
    if form is not None:
        options["form"] = form
    return registry.make_loss(name, temperature=temperature, **options)


def gcbs_quantile(n: int, batch_size: int) -> float:
    """Quantile keeping about 2B pairs per row: 1 - 2B / (N - 1), clipped to [0.5, 0.999]."""
    return float(min(0.999, max(0.5, 1.0 - 2.0 * batch_size / max(1, n - 1))))
