"""In-process swap and measured memory for PyTorch trials.

`trial.track(model, optimizer, *tensors)` hands a trial's state to a
`Tracker`. On salus-tune's `swap_out` the tracker copies every tracked
tensor (parameters, their gradients, buffers, optimizer state, extra
tensors) to host memory (pinned, on CUDA), points the tensors at those
copies and releases the allocator's cache; `swap_in` copies them back. The
process and the Python objects stay: parameters keep their identity, so the
optimizer and the training loop go on unchanged, and the copies are exact,
so a swapped trial's curve is bit-identical to an unswapped one's.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, List, Tuple

import torch

from salus_worker import torch_cuda_memory

__all__ = ["Tracker"]


def _holders(objects: Iterable[Any]) -> Iterator[Tuple[Any, Any]]:
    """(container, key) for every tracked tensor: reading `container[key]`
    (or the attribute) gives the tensor, and assigning replaces it."""
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for p in obj.parameters():
                yield ("param", p)
            for m in obj.modules():
                for name, b in m._buffers.items():
                    if b is not None:
                        yield (m._buffers, name)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for k, v in state.items():
                    if torch.is_tensor(v):
                        yield (state, k)
        elif isinstance(obj, torch.Tensor):
            yield ("param", obj)
        else:
            raise TypeError(f"trial.track takes modules, optimizers and tensors, not {type(obj).__name__}")


class Tracker:
    """A trial's tracked state; see the module docs."""

    def __init__(self, objects: Iterable[Any], device: str) -> None:
        self.objects: List[Any] = list(objects)
        self.device = torch.device("cuda" if device == "cuda" and torch.cuda.is_available() else "cpu")
        self.on_host = False
        # Where each tensor lived before a swap-out (the optimizer's `step`
        # counters stay on the CPU, for one).
        self._homes: List[torch.device] = []

    def _tensors(self) -> List[Tuple[Any, Any, torch.Tensor]]:
        out = []
        seen = set()
        for holder, key in _holders(self.objects):
            t = key if holder == "param" else holder[key]
            if id(t) in seen:
                continue
            seen.add(id(t))
            out.append((holder, key, t))
            grad = t.grad if holder == "param" else None
            if grad is not None and id(grad) not in seen:
                seen.add(id(grad))
                out.append(("grad", t, grad))
        return out

    def state_bytes(self) -> int:
        """Bytes of every tracked tensor."""
        return sum(t.numel() * t.element_size() for _, _, t in self._tensors())

    @staticmethod
    def _place(holder: Any, key: Any, moved: torch.Tensor) -> None:
        if holder == "param":
            key.data = moved
        elif holder == "grad":
            key.grad.data = moved
        else:
            holder[key] = moved

    def _move(self, to_host: bool) -> int:
        cuda = self.device.type == "cuda"
        before = torch.cuda.memory_reserved() if cuda else 0
        moved_bytes = 0
        tensors = self._tensors()
        if to_host:
            self._homes = [t.device for _, _, t in tensors]
        with torch.no_grad():
            for i, (holder, key, t) in enumerate(tensors):
                home = self._homes[i] if i < len(self._homes) else self.device
                if to_host:
                    if cuda and t.device.type == "cpu":
                        continue  # already on the host
                    copy = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=cuda)
                    copy.copy_(t, non_blocking=cuda)
                else:
                    if home.type == "cpu" and cuda:
                        continue
                    copy = torch.empty(t.shape, dtype=t.dtype, device=home)
                    copy.copy_(t, non_blocking=cuda)
                moved_bytes += t.numel() * t.element_size()
                self._place(holder, key, copy)
        if cuda:
            torch.cuda.synchronize()
            if to_host:
                torch.cuda.empty_cache()
            after = torch.cuda.memory_reserved()
            return abs(before - after)
        return moved_bytes

    def swap_out(self) -> int:
        """Moves the state to host memory; returns the device bytes freed."""
        if self.on_host:
            return 0
        freed = self._move(to_host=True)
        self.on_host = True
        return freed

    def swap_in(self) -> int:
        """Brings the state back; returns the device bytes taken."""
        if not self.on_host:
            return 0
        taken = self._move(to_host=False)
        self.on_host = False
        return taken

    def memory(self) -> Dict[str, int]:
        """Device memory in bytes: on CUDA, the caching allocator's own
        counts (`persistent` allocated now, `peak` since the last call,
        `cached` reserved beyond that); on the CPU, the tracked state."""
        if self.device.type == "cuda":
            return torch_cuda_memory(torch)
        return {"persistent": self.state_bytes()}
