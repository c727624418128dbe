"""``DeviceLoader``: move batches to the device ahead of use, in the main process.

Workers never create CUDA tensors (CUDA does not survive fork); the main process pins each batch
and copies it on a side stream while the previous step runs, so the training step finds its batch
already on the device.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Iterable, Iterator, Optional, Tuple, Union

import torch

from .._checks import MAX_ROWS, check_int

__all__ = ["DeviceLoader", "to_device"]


def to_device(obj: Any, device: torch.device, *, pin: bool, non_blocking: bool) -> Any:
    """Tensors inside dicts, lists and tuples moved to ``device``; everything else unchanged."""
    if isinstance(obj, torch.Tensor):
        if pin and obj.device.type == "cpu" and not obj.is_pinned():
            obj = obj.pin_memory()
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {k: to_device(v, device, pin=pin, non_blocking=non_blocking) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        moved = [to_device(v, device, pin=pin, non_blocking=non_blocking) for v in obj]
        return type(obj)(moved) if isinstance(obj, list) else tuple(moved)
    return obj


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (dict, list, tuple)):
        for v in obj.values() if isinstance(obj, dict) else obj:
            yield from _tensors(v)


class DeviceLoader:
    """Wrap a DataLoader (or any iterable of batches) so batches arrive on ``device``.

    On CUDA, batches are pinned (unless already pinned, e.g. ``DataLoader(pin_memory=True)``)
    and copied with ``non_blocking`` on a side stream, ``prefetch`` batches ahead; the consumer's
    stream waits for each copy and the tensors are recorded on it so their memory is not reused
    early. On other devices (CPU, tests) batches are moved synchronously with no pinning.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: Union[str, torch.device],
        non_blocking: bool = True,
        prefetch: int = 2,
    ) -> None:
        self.prefetch = check_int(prefetch, "prefetch", 1, MAX_ROWS)
        self.loader = loader
        self.device = torch.device(device)
        self.non_blocking = bool(non_blocking)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # set_epoch, state_dict, dataset, ... of the wrapped loader.
        loader = self.__dict__.get("loader")
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)

    def __iter__(self) -> Iterator[Any]:
        cuda = self.device.type == "cuda"
        stream = torch.cuda.Stream(self.device) if cuda else None
        pending: Deque[Tuple[Any, Optional[torch.cuda.Event]]] = deque()
        source = iter(self.loader)

        def submit() -> None:
            try:
                batch = next(source)
            except StopIteration:
                return
            if stream is None:
                pending.append((to_device(batch, self.device, pin=False, non_blocking=False), None))
                return
            with torch.cuda.stream(stream):
                moved = to_device(batch, self.device, pin=True, non_blocking=self.non_blocking)
                event = torch.cuda.Event()
                event.record(stream)
            pending.append((moved, event))

        for _ in range(self.prefetch):
            submit()
        while pending:
            batch, event = pending.popleft()
            if event is not None:
                current = torch.cuda.current_stream(self.device)
                current.wait_event(event)
                for t in _tensors(batch):
                    t.record_stream(current)
            submit()
            yield batch
