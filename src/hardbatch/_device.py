"""Devices, precision and work splitting shared by the graph, GCBS and distributed builds.

Public names of a private module: the library's own helpers, not part of the user API.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["BLOCK_ELEMENTS_CPU", "BLOCK_ELEMENTS_CUDA", "Precision", "block_elements",
           "check_dtype", "check_precision", "matmul_fp32", "resolve_device", "shard_range"]

Precision = Literal["fp32", "bf16", "fp16"]

# Target elements of one similarity block (rows x columns); bounds working memory.
BLOCK_ELEMENTS_CPU = 1 << 22
BLOCK_ELEMENTS_CUDA = 1 << 26
_HALF = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
_OUT_DTYPE_OK: dict[str, bool] = {}


def resolve_device(device: str | torch.device | None, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device`` (None: CPU); ``ValueError`` naming ``name`` for anything
    else than a device, a device name or a CUDA index, or a CUDA device this machine lacks.

    Example:
        >>> from hardbatch._device import resolve_device
        >>> resolve_device(None), resolve_device("cpu")
        (device(type='cpu'), device(type='cpu'))
        >>> try:
        ...     resolve_device("gpu")
        ... except ValueError as err:
        ...     print(str(err).split(";")[0])
        device='gpu' is not a torch device
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise ValueError(f"{name} must be a torch.device, a device name or a CUDA index, got "
                         f"{type(device).__name__} {device!r:.60}; pass 'cpu', 'cuda' or 'cuda:0'")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(f"{name}={device!r} is not a torch device; pass 'cpu', 'cuda' or "
                         "'cuda:0'") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name}={device!r} but CUDA is not available; pass {name}='cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={device!r} but this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s); pass {name}='cuda:0'")
    return dev


def check_dtype(dtype, name: str = "dtype", floating: bool = True) -> torch.dtype:
    """``dtype`` if it is a ``torch.dtype`` (a floating one with ``floating``); ``ValueError``
    naming ``name`` otherwise (a string or a NumPy type included: pass ``torch.float32``).

    Example:
        >>> import torch
        >>> from hardbatch._device import check_dtype
        >>> check_dtype(torch.bfloat16)
        torch.bfloat16
        >>> try:
        ...     check_dtype("float32")
        ... except ValueError as err:
        ...     print(str(err).split(";")[0])
        dtype must be a torch.dtype, got str 'float32'
    """
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name} must be a torch.dtype, got {type(dtype).__name__} "
                         f"{dtype!r:.60}; pass e.g. torch.float32")
    if floating and not dtype.is_floating_point:
        raise ValueError(f"{name}={dtype} must be a floating point dtype (torch.float32, "
                         "torch.bfloat16 or torch.float16)")
    return dtype


def check_precision(precision: str) -> torch.dtype:
    """Storage dtype of the embeddings for ``precision`` (fp32, bf16 or fp16)."""
    if precision not in _HALF:
        raise ValueError(f"precision={precision!r} must be 'fp32', 'bf16' or 'fp16'")
    return _HALF[precision] or torch.float32


def block_elements(device: torch.device) -> int:
    """Similarities computed per block: ~4M on CPU (cache-sized), ~64M on CUDA."""
    return BLOCK_ELEMENTS_CUDA if device.type == "cuda" else BLOCK_ELEMENTS_CPU


def matmul_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` (2-D or batched 3-D) as float32, with fp32 accumulation for half inputs.

    float32 inputs: a plain product. bf16/fp16 inputs: on CUDA the product is
    written in fp32 (``out_dtype=torch.float32``, torch >= 2.8; older torch
    returns the half result, widened); on other devices the half product
    (accumulated in fp32 by torch's CPU kernels) is widened.
    """
    if a.dtype == torch.float32:
        return a @ b
    key = a.device.type
    if key == "cuda" and _OUT_DTYPE_OK.get(key, True):
        op = torch.bmm if a.ndim == 3 else torch.mm
        try:
            return op(a, b, out_dtype=torch.float32)
        except (RuntimeError, TypeError, NotImplementedError):
            _OUT_DTYPE_OK[key] = False
    return (a @ b).float()


def shard_range(num_units: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous share ``[start, end)`` of ``num_units`` work units for ``rank`` of ``world_size``."""
    return num_units * rank // world_size, num_units * (rank + 1) // world_size
