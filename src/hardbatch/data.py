"""Datasets whose items carry their index: what a loop over a hardbatch sampler needs.

A hardbatch sampler hands the ``DataLoader`` item ids; the loop needs them back with the
inputs, to feed the :class:`~hardbatch.EmbeddingBank` (``bank.update(idx, z1)``), so each item
must be ``(index, view1, view2)``. :class:`IndexedDataset` wraps any map-style dataset so::

    data = hb.IndexedDataset(dataset, transform=augment)      # items: (i, view1, view2)
    loader = DataLoader(data, batch_sampler=sampler)
    for batch in loader:
        idx, x1, x2 = hb.indexed_batch(batch)                  # clear error if idx is missing
        z1, z2 = model(x1), model(x2)
        ...
        bank.update(idx, z1.detach())

:func:`indexed_batch` is the check a loop (and :class:`hardbatch.train.Trainer`) runs on a
collated batch: the first entry must be the ``[B]`` integer ids, one per row of the views.

A plain ``DataLoader(tensor, batch_sampler=sampler)`` gives batches without ids, and the loop
``for idx, x1, x2 in loader`` fails with Python's bare "too many values to unpack". The
``DataLoader`` gives its sampler no reference to itself or its dataset, but it asks the sampler
for the first batch from its own iterator, whose ``_dataset`` the sampler can find on the
call stack: every hardbatch sampler calls :func:`warn_if_loader_items_lack_index` when it starts
an epoch, which warns when :func:`unindexed_items` is sure that the
loader's items carry no index (a tensor or array of inputs, a ``TensorDataset`` of float
tensors, a list of inputs or of ``(input, label)`` pairs, a torchvision dataset), naming
:class:`IndexedDataset`. Datasets it cannot inspect without reading an item (any other
``Dataset``) are not read and get no warning.
"""

from __future__ import annotations

import numbers
import sys
import warnings
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

__all__ = ["IndexedDataset", "indexed_batch", "looks_indexed", "unindexed_items",
           "warn_if_loader_items_lack_index"]

_FRAMES = 8  # call-stack depth searched for the DataLoader iterator (sampler wrappers included)


class IndexedDataset(torch.utils.data.Dataset):
    """``dataset`` with items ``(index, view_1, ..., view_views)``.

    Args:
        dataset: a map-style dataset; an item that is a tuple or list (``(x, label)``, as
            torchvision datasets return) contributes its first entry, the input.
        transform: ``transform(x) -> view``, called once per view (a random augmentation gives
            two different views of the same input); None: every view is the input itself
            (e.g. SimCSE, whose two views differ by dropout inside the model).
        views: number of views per item (default 2; 1 gives ``(index, view)``).

    ``item[0]`` is the int index, so the default collate turns a batch into an int64 ``[B]``
    tensor of the sampler's ids, which ``bank.update`` takes as is.

    Example:
        >>> import torch
        >>> from hardbatch import IndexedDataset
        >>> data = IndexedDataset(torch.arange(40.0).reshape(10, 4), transform=lambda x: x + 1)
        >>> i, view1, view2 = data[3]
        >>> i, view1.tolist()
        (3, [13.0, 14.0, 15.0, 16.0])
        >>> idx, x1, x2 = next(iter(torch.utils.data.DataLoader(data, batch_sampler=[[3, 0, 7]])))
        >>> idx, tuple(x1.shape)
        (tensor([3, 0, 7]), (3, 4))
    """

    def __init__(self, dataset, transform: Callable | None = None, views: int = 2) -> None:
        if isinstance(views, bool) or not isinstance(views, numbers.Integral) or views < 1:
            raise ValueError(f"views={views!r} must be a positive integer (2: a pair of views)")
        if transform is not None and not callable(transform):
            raise ValueError(f"transform must be callable (x -> view) or None, got "
                             f"{type(transform).__name__}")
        try:
            len(dataset)
        except TypeError as exc:
            raise ValueError("dataset must be a map-style dataset (with __len__ and "
                             "__getitem__), got an object without len()") from exc
        self.dataset = dataset
        self.transform = transform
        self.views = int(views)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        x = self.dataset[i]
        if isinstance(x, (tuple, list)):
            x = x[0]
        if self.transform is None:
            return (int(i), *([x] * self.views))
        return (int(i), *(self.transform(x) for _ in range(self.views)))


def _is_index(value, position: int) -> bool:
    if isinstance(value, Tensor):
        return value.ndim == 0 and not value.is_floating_point() and int(value) == position
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and int(value) == position)


def looks_indexed(dataset) -> bool:
    """True when ``dataset``'s items already start with their index: an
    :class:`IndexedDataset`, or items 0 and 1 that are tuples starting with 0 and 1.

    Example:
        >>> from hardbatch.data import IndexedDataset, looks_indexed
        >>> looks_indexed([(0, "a", "a"), (1, "b", "b")]), looks_indexed(["a", "b"])
        (True, False)
        >>> looks_indexed(IndexedDataset(["a", "b"]))
        True
    """
    if isinstance(dataset, IndexedDataset):
        return True
    try:
        return len(dataset) >= 2 and all(
            isinstance(item, (tuple, list)) and len(item) >= 2 and _is_index(item[0], k)
            for k, item in ((k, dataset[k]) for k in range(2)))
    except Exception:  # noqa: BLE001 - a dataset we cannot probe: not indexed
        return False


def _describe(value) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"


def indexed_batch(batch, ids=None) -> tuple[Tensor, ...]:
    """Check and split a collated batch of indexed items: ``(idx, view_1, ...)``.

    Args:
        batch: what the ``DataLoader`` yields for a batch of :class:`IndexedDataset` items
            (a tuple / list whose first entry is the ids).
        ids: the ids the sampler handed out for this batch (a sequence or tensor), or None;
            when given, the first entry must equal them.

    Returns:
        ``(idx, *views)`` with ``idx`` an int64 ``[B]`` tensor.

    Raises:
        ValueError: the first entry is not a 1-D integer tensor of one id per row of the
            views: the dataset's items lack their index (wrap it in :class:`IndexedDataset`).

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> from hardbatch import IndexedDataset, indexed_batch
        >>> data = IndexedDataset(torch.zeros(40, 8))
        >>> batch = next(iter(DataLoader(data, batch_sampler=[[5, 1, 7]])))
        >>> idx, view1, view2 = indexed_batch(batch, ids=[5, 1, 7])
        >>> idx.tolist(), tuple(view1.shape)
        ([5, 1, 7], (3, 8))
        >>> indexed_batch([torch.zeros(3, 8), torch.zeros(3, 8)])
        Traceback (most recent call last):
            ...
        ValueError: the batch's first entry is a torch.float32 tensor of shape [3, 8], ...
    """
    fix = ("the loader's items must start with their index, (index, view1, view2): wrap the "
           "dataset as hardbatch.IndexedDataset(dataset, transform)")
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        raise ValueError(f"a batch of {_describe(batch)} has no index entry; {fix}")
    idx = batch[0]
    if not isinstance(idx, Tensor) or idx.ndim != 1 or idx.is_floating_point() \
            or idx.dtype == torch.bool:
        raise ValueError(f"the batch's first entry is {_describe(idx)}, not the [B] integer "
                         f"item ids; {fix}")
    if ids is not None and not torch.equal(idx.long().cpu(), torch.as_tensor(ids).long().cpu()):
        raise ValueError(f"the batch's first entry {idx.tolist()[:8]} is not the sampler's ids "
                         f"{torch.as_tensor(ids).tolist()[:8]}; {fix}")
    for k, view in enumerate(batch[1:], 1):
        rows = view.shape[0] if isinstance(view, Tensor) and view.ndim else None
        if rows is not None and rows != idx.numel():
            raise ValueError(f"the batch's first entry holds {idx.numel()} ids but entry {k} "
                             f"has {rows} rows; {fix}")
    return (idx.long(), *batch[1:])


def _is_ids(value) -> bool:
    """A 1-D integer tensor or array: the dataset's items are ids themselves."""
    if isinstance(value, Tensor):
        return value.ndim == 1 and not value.is_floating_point() and value.dtype != torch.bool \
            and not value.is_complex()
    return isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iu"


def _input_like(value) -> bool:
    """An item (or an item's first entry) that is an input, not an index."""
    if isinstance(value, (Tensor, np.ndarray)):
        return value.ndim >= 1 or (isinstance(value, Tensor) and value.is_floating_point())
    return isinstance(value, (float, str, bytes))


def unindexed_items(dataset) -> str | None:
    """What ``dataset`` is, when its items certainly carry no index (else None).

    Only what can be told without side effects is judged: a tensor or array of inputs (not a
    1-D integer one, whose items are ids), a ``TensorDataset`` whose first tensor is not 1-D
    integer ids, a list or tuple whose first item is an input or an ``(input, label)`` pair,
    and torchvision's datasets (``(image, target)`` items). An :class:`IndexedDataset` and any
    other ``Dataset`` (its items are not read) give None.

    Example:
        >>> import torch
        >>> from hardbatch.data import IndexedDataset, unindexed_items
        >>> unindexed_items(torch.zeros(40, 8))
        'a torch.float32 tensor of shape [40, 8]'
        >>> unindexed_items(torch.arange(40)), unindexed_items(IndexedDataset(torch.zeros(40, 8)))
        (None, None)
        >>> unindexed_items([(torch.zeros(8), 3), (torch.ones(8), 1)])
        'a list of 2 items whose item 0 starts with a torch.float32 tensor of shape [8]'
    """
    if isinstance(dataset, IndexedDataset):
        return None
    if isinstance(dataset, (Tensor, np.ndarray)):
        if _is_ids(dataset) or dataset.ndim == 0:
            return None
        dtype = dataset.dtype if isinstance(dataset, Tensor) else f"numpy {dataset.dtype}"
        return f"a {dtype} {'tensor' if isinstance(dataset, Tensor) else 'array'} of shape " \
               f"{list(dataset.shape)}"
    if isinstance(dataset, torch.utils.data.TensorDataset):
        first = dataset.tensors[0] if dataset.tensors else None
        if first is None or _is_ids(first):
            return None
        return f"a TensorDataset whose first tensor is {_describe(first)}"
    if isinstance(dataset, (list, tuple)) and dataset:
        item = dataset[0]
        head = item[0] if isinstance(item, (tuple, list)) and item else item
        if _input_like(head):
            what = "starts with" if head is not item else "is"
            return f"a {type(dataset).__name__} of {len(dataset)} items whose item 0 {what} " \
                   f"{_describe(head) if isinstance(head, Tensor) else repr(head)[:40]}"
        return None
    module = type(dataset).__module__ or ""
    if module.split(".")[:2] == ["torchvision", "datasets"]:
        return f"a torchvision {type(dataset).__name__} ((image, target) items)"
    return None


def _loader_dataset(frame) -> tuple[bool, object]:
    """``(found, dataset)`` of the ``DataLoader`` iterator among ``frame``'s callers."""
    loader_iter = getattr(torch.utils.data.dataloader, "_BaseDataLoaderIter", None)
    for _ in range(_FRAMES):
        if frame is None or loader_iter is None:
            break
        owner = frame.f_locals.get("self")
        if isinstance(owner, loader_iter):
            return True, getattr(owner, "_dataset", None)
        frame = frame.f_back
    return False, None


def warn_if_loader_items_lack_index(sampler) -> bool:
    """Warn when a ``DataLoader`` whose items carry no index drives ``sampler``.

    Called by every hardbatch sampler when an epoch starts, i.e. when the loader asks for its
    first batch: the ``DataLoader`` sets no reference from the sampler to itself, so the
    loader's iterator is looked up on the call stack (its ``_dataset``; nothing is found, and
    nothing happens, outside a ``DataLoader``). The dataset is judged by
    :func:`unindexed_items`. Returns True when it warned (a ``UserWarning`` from the sampler's
    ``__iter__``, which Python's default filter shows once per dataset description).

    Example:
        >>> import warnings
        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> from hardbatch import IndexedDataset, UniformBatchSampler
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     batch = next(iter(DataLoader(torch.zeros(40, 8),
        ...                                  batch_sampler=UniformBatchSampler(40, 8))))
        >>> tuple(batch.shape), "IndexedDataset" in str(caught[0].message)  # no ids: a warning
        ((8, 8), True)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     idx, x1, x2 = next(iter(DataLoader(IndexedDataset(torch.zeros(40, 8)),
        ...                                        batch_sampler=UniformBatchSampler(40, 8))))
        >>> len(caught), tuple(idx.shape)
        (0, (8,))
    """
    try:
        found, dataset = _loader_dataset(sys._getframe(1))
        what = unindexed_items(dataset) if found else None
    except Exception:  # noqa: BLE001 - a best-effort hint: never break the loop
        return False
    if what is None:
        return False
    name = type(sampler).__name__
    warnings.warn(
        f"{name} drives a DataLoader over {what}: its items carry no index, so a batch holds "
        "the inputs alone and `for idx, x1, x2 in loader` fails with Python's bare \"... values "
        "to unpack\" error. A loop that feeds an EmbeddingBank needs each item's index: wrap "
        "the data, DataLoader(hardbatch.IndexedDataset(data, transform=augment), "
        "batch_sampler=sampler), for (index, view1, view2) items (views=1: (index, input)).",
        UserWarning, stacklevel=2)
    return True
