"""PyTorch Geometric integration: hardbatch samplers over datasets of graphs.

A hardbatch sampler is a batch sampler over item ids, so it plugs straight into PyG's loader::

    from torch_geometric.loader import DataLoader
    from hardbatch.integrations.pyg import IndexedGraphDataset, graph_embeddings

    data = IndexedGraphDataset(TUDataset(root, "MUTAG"))     # adds data.item_id
    bank = hb.EmbeddingBank(len(data), dim=128)
    sampler = hb.ProximityGraphSampler(bank, batch_size=128, candidates=100, neighbors=50)
    loader = DataLoader(data, batch_sampler=sampler)          # batch_size / shuffle left unset
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            z1, z2 = model(augment(batch)), model(augment(batch))   # [num_graphs, d]
            loss = criterion(z1, z2)
            ...
            bank.update(batch.item_id, z1.detach())

``IndexedGraphDataset`` stores each graph's position as the graph-level attribute ``item_id``
(PyG batches it into a ``[num_graphs]`` tensor; the name avoids ``"index"``, which PyG would
offset by the node count). To refresh from a fresh encoding pass instead of a bank, pass
``embedding_source(model, dataset)`` as the sampler's embeddings.

torch_geometric is imported only inside the functions that need it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["IndexedGraphDataset", "embedding_source", "graph_embeddings", "update_bank"]

ITEM_KEY = "item_id"


class IndexedGraphDataset(torch.utils.data.Dataset):
    """Wraps a PyG dataset (or a list of ``Data``) so that graph ``i`` carries ``item_id = i``.

    Items are shallow copies: the wrapped dataset's graphs are not modified.
    """

    def __init__(self, dataset, key: str = ITEM_KEY) -> None:
        if "index" in key or "face" in key:
            raise ValueError(
                f"key={key!r}: PyG offsets attributes whose name contains 'index' "
                "or 'face' when batching; use a name such as 'item_id'"
            )
        self.dataset = dataset
        self.key = key

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        if not isinstance(i, int):
            i = int(i)
        data = copy.copy(self.dataset[i])
        data[self.key] = torch.tensor([i], dtype=torch.long)
        return data


def update_bank(bank, batch, embeddings: torch.Tensor, key: str = ITEM_KEY) -> None:
    """``bank.update(batch.item_id, embeddings)`` for a PyG ``Batch`` of an indexed dataset."""
    if key not in batch:
        raise ValueError(
            f"the batch has no '{key}' attribute: wrap the dataset in "
            "IndexedGraphDataset so that graphs carry their ids"
        )
    bank.update(batch[key].reshape(-1), embeddings.detach().float())


@torch.no_grad()
def graph_embeddings(
    model: nn.Module,
    dataset,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
) -> torch.Tensor:
    """Graph-level embeddings ``[N, d]`` of every graph in ``dataset``, in dataset order.

    ``model(batch)`` must return ``[num_graphs, d]`` for a PyG ``Batch``. Runs in eval mode
    (training mode restored) without gradients; returns a float32 CPU tensor.
    """
    from torch_geometric.loader import DataLoader

    was_training = model.training
    model.eval()
    try:
        out = []
        for batch in DataLoader(
            dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers
        ):
            z = model(batch.to(device))
            if z.ndim != 2 or z.shape[0] != batch.num_graphs:
                raise ValueError(
                    f"model(batch) must return [num_graphs, d] = "
                    f"[{batch.num_graphs}, d], got {tuple(z.shape)}"
                )
            out.append(z.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(out)


def embedding_source(
    model: nn.Module, dataset, batch_size: int = 256, device: str | torch.device = "cpu"
) -> Callable[[], torch.Tensor]:
    """A callable embedding source for samplers: a fresh :func:`graph_embeddings` pass per call."""
    return lambda: graph_embeddings(model, dataset, batch_size, device)
