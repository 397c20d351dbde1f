"""Input checks shared by the public API: clear ``ValueError`` messages naming the parameter and the fix."""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch


def check_int(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int within ``[low, high]``; ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if low is not None and value < low:
        raise ValueError(f"{name}={value} must be >= {low}")
    if high is not None and value > high:
        raise ValueError(f"{name}={value} must be <= {high}")
    return value


def check_real(value, name: str, expected: str = "a number") -> float:
    """``value`` as a float: a Python or NumPy real scalar or a 0-d tensor/array, never a bool."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return float(value)


def check_generator(generator, name: str = "generator") -> torch.Generator | None:
    """``generator`` if it is a ``torch.Generator`` or None; ``ValueError`` naming ``name``.

    Example:
        >>> import torch
        >>> from hardbatch._validation import check_generator
        >>> check_generator(None) is None
        True
        >>> try:
        ...     check_generator(123)
        ... except ValueError as err:
        ...     print(str(err).split(";")[0])
        generator must be a torch.Generator or None, got int 123
    """
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    raise ValueError(f"{name} must be a torch.Generator or None, got {type(generator).__name__} "
                     f"{generator!r:.60}; pass e.g. torch.Generator().manual_seed(0) (on the "
                     "device of the tensors it draws for)")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """``ValueError`` listing ``choices`` unless ``value`` is one of them."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; use one of {', '.join(map(repr, choices))}")


def check_constant(value, name: str, expected: str) -> float:
    """:func:`check_real`, refusing a tensor that requires grad (a learnable hyperparameter)."""
    if isinstance(value, torch.Tensor) and value.requires_grad:
        # float() would silently cut a learnable value off its gradient
        raise ValueError(
            f"{name} must be a constant, got a tensor that requires grad; learnable values "
            f"are not supported, pass float({name}) to use its current value"
        )
    return check_real(value, name, expected)


def check_matrix_shape(shape: tuple, name: str) -> None:
    """``ValueError`` unless ``shape`` is a non-empty 2-D [N, d]."""
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D [N, d], got shape {tuple(shape)}; "
                         "reshape it to one row per item")
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(shape)}); pass at least one item "
                         "with at least one feature")


def reject_sampler(x, name: str, expected: str = "the items") -> None:
    """``ValueError`` if ``x`` is a torch ``Sampler``: a framework rebuilt a hardbatch batch
    sampler around its own sampler (PyTorch Lightning under DDP, by default), which would
    otherwise plan over the sampler's share of the items, or fail obscurely."""
    if isinstance(x, torch.utils.data.Sampler):
        raise ValueError(
            f"{name} is a {type(x).__name__} (a torch Sampler), not {expected}: a framework "
            "rebuilt this hardbatch batch sampler around its own sampler. PyTorch Lightning does "
            "so under DDP: pass Trainer(use_distributed_sampler=False) (hardbatch samplers "
            "split their batches across ranks themselves; docs/integrations.md)")


def to_numpy_2d(x, name: str) -> np.ndarray:
    reject_sampler(x, name)
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        x = x.cpu().numpy()
    elif not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as exc:  # pragma: no cover - exotic inputs
            raise ValueError(f"{name} must be a tensor or array of shape [N, d]") from exc
    check_matrix_shape(x.shape, name)
    return x


def embedding_tensor(x, name: str = "embeddings", *, finite: bool = True) -> torch.Tensor:
    """``x`` as a validated float32 contiguous ``[N, d]`` tensor on its own device.

    A tensor stays where it is (a CUDA tensor never visits the host); an array becomes a CPU
    tensor sharing its memory where possible. ``ValueError`` for a wrong rank, empty data, a
    non-numeric dtype and (``finite``) NaN / inf, naming ``name`` and the first bad row.

    Example:
        >>> import numpy as np
        >>> from hardbatch._validation import embedding_tensor
        >>> embedding_tensor(np.ones((40, 8))).dtype
        torch.float32
        >>> try:
        ...     embedding_tensor(np.full((40, 8), np.nan))
        ... except ValueError as err:
        ...     print(str(err).split(";")[0])
        embeddings contains NaN or inf (first at row 0)
    """
    if not isinstance(x, torch.Tensor):
        x = to_numpy_2d(x, name)
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise ValueError(f"{name} must hold numbers, got dtype {x.dtype}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        x = torch.from_numpy(x if x.flags.writeable else x.copy())
    check_matrix_shape(x.shape, name)
    if x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name} must hold numbers, got dtype {x.dtype}")
    x = x.detach().to(torch.float32).contiguous()
    if finite and not bool(torch.isfinite(torch.stack(torch.aminmax(x))).all()):  # one pass
        row = int((~torch.isfinite(x).all(dim=1)).nonzero()[0, 0])
        raise ValueError(f"{name} contains NaN or inf (first at row {row}); check the encoder "
                         "output (e.g. a diverged loss or fp16 overflow) before sampling")
    return x


def as_embeddings(x, name: str = "embeddings", normalize: bool = False) -> np.ndarray:
    """:func:`embedding_tensor` as a CPU float32 array (with ``normalize``: unit rows, by
    :func:`l2_normalize_rows`), a view of ``x`` where possible.

    Example:
        >>> import numpy as np
        >>> from hardbatch._validation import as_embeddings
        >>> as_embeddings(np.full((40, 8), 2.0), normalize=True)[0, :2]
        array([0.35355338, 0.35355338], dtype=float32)
    """
    t = embedding_tensor(x, name)
    return (l2_normalize_rows(t) if normalize else t).cpu().numpy()


def l2_normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """``F.normalize(x, dim=1)``, scale-safe, with a zero gradient at an all-zero row: the one
    row normaliser of the library (losses, samplers, graphs, GCBS, metrics).

    On the CPU, when every row's norm is finite and non-zero, exactly ``F.normalize``'s
    operations. Otherwise (and on other devices, to avoid a sync) every row whose largest entry
    is >= 1 is first divided by the power of two that brings it into ``[0.5, 1)``: its squared
    norm cannot overflow (float32 rows above ~1e19 became zero), and since the division is exact,
    values and gradients equal ``F.normalize``'s bit for bit otherwise. An all-zero row is
    multiplied by 0, so it stays zero with a zero gradient (``F.normalize`` gives it
    ``1 / eps = 1e12``, ``inf`` once cast back to fp16). A row of norm below 1e-12 is divided by
    1e-12, as by ``F.normalize``.

    Example:
        >>> import torch
        >>> from hardbatch._validation import l2_normalize_rows
        >>> l2_normalize_rows(torch.tensor([[3e30, -4e30], [0.0, 0.0]]))
        tensor([[ 0.6000, -0.8000],
                [ 0.0000,  0.0000]])
    """
    if x.device.type == "cpu" and x.shape[0]:
        norm = x.norm(2, 1, keepdim=True)  # F.normalize's own steps, when nothing is special
        low, high = torch.aminmax(norm.detach())
        if float(low) > 0 and float(high) < math.inf:
            return x / norm.clamp_min(1e-12).expand_as(x)
    amax = x.detach().abs().amax(dim=1)
    _, exponent = torch.frexp(amax)
    scale = torch.ldexp(torch.ones_like(amax), -exponent.clamp(min=0))
    scale = torch.where(amax > 0, scale, torch.zeros_like(scale))
    return torch.nn.functional.normalize(x * scale[:, None], dim=1)


def to_numpy_index_table(x, name: str) -> np.ndarray:
    """Validated int64 C-contiguous [N, K] index table."""
    x = to_numpy_2d(x, name)
    if not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"{name} must hold integer item ids, got dtype {x.dtype}")
    return np.ascontiguousarray(x, dtype=np.int64)


def num_items_of(n_or_dataset, name: str = "n_or_dataset") -> int:
    """Number of items from an int or a sized dataset."""
    reject_sampler(n_or_dataset, name)
    if isinstance(n_or_dataset, numbers.Integral) and not isinstance(n_or_dataset, bool):
        n = int(n_or_dataset)
    elif hasattr(n_or_dataset, "__len__"):
        n = len(n_or_dataset)
    else:
        raise ValueError(f"{name} must be the number of items or a sized dataset, "
                         f"got {type(n_or_dataset).__name__}")
    if n <= 0:
        raise ValueError(f"{name} has no items (N={n}); pass a non-empty dataset")
    return n


# --------------------------------------------------------------------- contrastive loss options


# Below float32's smallest normal number (1.2e-38) 1 / t overflows float32; already near it the
# per-row losses (up to ~2 / t) overflow when a batch's rows are summed. 1e-30 keeps 1 / t at most
# 1e30, summable over 1e8 rows in float32.
MIN_TEMPERATURE = 1e-30


def check_temperature(temperature) -> float:
    """The loss temperature as a float (also takes numpy scalars and 0-d tensors).

    At least :data:`MIN_TEMPERATURE` (1e-30): the losses compute half and single precision
    inputs in float32, where a smaller ``t`` makes ``1 / t`` (below ~1.2e-38, float32's smallest
    normal number) or the batch's summed loss overflow.
    """
    hint = "a finite number > 0 (e.g. 0.5 for SimCLR, 0.05 for SimCSE)"
    t = check_constant(temperature, "temperature", hint)
    if not math.isfinite(t) or t <= 0:
        raise ValueError(f"temperature must be {hint}, got {temperature!r}")
    if t < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature={t:g} is too small: it must be >= {MIN_TEMPERATURE:g}, since the losses "
            "compute in float32 (half and single precision inputs), where 1/temperature "
            "overflows below float32's smallest normal number (1.2e-38) and the summed loss of a "
            "batch (up to 2/temperature per row) already near it; use e.g. 0.05 - 1"
        )
    return t


def check_margin(margin) -> float:
    """A guided mask's ``margin`` (GISTEmbed) as a finite float (negative values allowed)."""
    hint = ("a finite number (the guide similarity margin below the positive's; 0.0 masks "
            "only candidates the guide finds closer than the positive)")
    value = check_constant(margin, "margin", hint)
    if not math.isfinite(value):
        raise ValueError(f"margin must be {hint}, got {margin!r}")
    return value


def check_tau_plus(tau_plus) -> float:
    """DCL / HCL's class prior of false negatives as a float in ``[0, 1)``."""
    hint = "in [0, 1) (class prior of false negatives), e.g. 0.1"
    value = check_constant(tau_plus, "tau_plus", hint)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"tau_plus must be {hint}, got {tau_plus!r}")
    return value


def check_beta(beta) -> float:
    """HCL's hardness concentration as a finite float >= 0."""
    hint = "a finite number >= 0 (hardness concentration; 0 disables the reweighting)"
    value = check_constant(beta, "beta", hint)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"beta must be {hint}, got {beta!r}")
    return value


def check_synthetic(hardest, synthetic) -> tuple[int, int]:
    """SSCL's ``(hardest, synthetic)`` as Python ints >= 0 (numpy integers accepted)."""
    hardest, synthetic = check_int(hardest, "hardest", 0), check_int(synthetic, "synthetic", 0)
    if synthetic > 0 and hardest == 0:
        raise ValueError(
            "hardest must be >= 1 when synthetic > 0 (synthetic negatives are mixed from the "
            "hardest ones); set synthetic=0 to disable them"
        )
    return hardest, synthetic
