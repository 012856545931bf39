"""A resumable prompt loader: seeded shuffles per epoch and a position that checkpoints save and restore."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from nemo_rl_clone.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_clone.utils.unsupported_modules import refusing_getattr

# NeMo-RL's loader over several datasets at once (data.use_multiple_dataloader, refused by the data config too).
__getattr__ = refusing_getattr(
    __name__, {"MultipleDataloaderWrapper": "several dataloaders in one run (data.use_multiple_dataloader)"}
)


class IndexedDataset(Protocol):
    """What the loader needs of a dataset: a length and rows by index (torch map-style datasets, lists, ...)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class DrawnRows:
    """A torch ``IterableDataset`` that has a length (NeMo-RL's scripts deal endless generated games as one) read by
    index: rows are drawn from its iterator as far as the highest index asked for, and kept. The loader reads such a
    dataset in order (`StatefulPromptLoader` with ``shuffle=False``), so only the rows it used are held."""

    def __init__(self, dataset: Any) -> None:
        self._length = len(dataset)
        self._rows: list[Any] = []
        self._source = iter(dataset)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Any:
        while len(self._rows) <= index:
            self._rows.append(next(self._source))
        return self._rows[index]


class StatefulPromptLoader:
    """Batches of ``batch_size`` prompts from ``dataset``, collated by ``collate_fn``.

    Epoch ``e`` visits the dataset in the order of a permutation seeded by ``seed + e`` (or in order without
    ``shuffle``); an incomplete last batch is dropped so every step sees the same number of prompts. The loader
    is an endless iterator over epochs; the caller stops it (``max_num_epochs`` is the caller's business through
    `completed_epochs`). `state_dict` / `load_state_dict` make a resumed run continue with exactly the next batch.
    """

    def __init__(
        self,
        dataset: IndexedDataset,
        batch_size: int,
        collate_fn: Callable[[list[Any]], BatchedDataDict],
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if len(dataset) < batch_size:
            raise ValueError(f"the dataset has {len(dataset)} prompts, fewer than one batch of {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.batch_in_epoch = 0

    @property
    def batches_per_epoch(self) -> int:
        return len(self.dataset) // self.batch_size

    @property
    def completed_epochs(self) -> int:
        """Epochs fully consumed. ``epoch`` only moves on when the next batch is drawn, so it lags by one after
        an epoch's last batch: a loop stopping on ``epoch`` would run one step into the next epoch."""
        return self.epoch + (1 if self.batch_in_epoch >= self.batches_per_epoch else 0)

    def __len__(self) -> int:
        return self.batches_per_epoch

    def __iter__(self) -> Iterator[BatchedDataDict]:
        while True:
            order = self._epoch_order(self.epoch)
            while self.batch_in_epoch < self.batches_per_epoch:
                start = self.batch_in_epoch * self.batch_size
                indices = order[start : start + self.batch_size]
                self.batch_in_epoch += 1
                yield self.collate_fn([self.dataset[i] for i in indices])
            self.epoch += 1
            self.batch_in_epoch = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"dataloader state was saved with seed {state['seed']}, this run uses {self.seed}")
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()
