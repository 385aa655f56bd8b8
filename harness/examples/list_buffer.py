"""A user's own replay buffer wired into rbcheck in about 50 lines.

Run the conformance suite on it with ``rbcheck validate example`` (its
built-in name) or ``rbcheck validate rbcheck.harness.examples.list_buffer:adapter``.
It declares only "random": every other property is skipped with the reason.
"""

import torch
from tensordict import TensorDict

from rbcheck.harness.protocol import Adapter, BufferSpec


class ListBuffer:
    """A ring of TensorDict rows kept in a Python list; uniform sampling."""

    def __init__(self, capacity: int, seed: int = 0):
        self.capacity, self.rows, self.cursor, self.write_count = capacity, [], 0, 0
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: TensorDict) -> int:
        slot = self.cursor
        if slot == len(self.rows):
            self.rows.append(row.clone())
        else:
            self.rows[slot] = row.clone()
        self.cursor, self.write_count = (slot + 1) % self.capacity, self.write_count + 1
        return slot

    def extend(self, data: TensorDict) -> torch.Tensor:
        return torch.tensor([self.add(row) for row in data.unbind(0)], dtype=torch.long)

    def sample(self, batch_size: int):
        # Same draw as the reference: float64 uniforms scaled by the length.
        u = torch.rand(batch_size, generator=self.generator, dtype=torch.float64)
        index = (u * len(self.rows)).long().clamp_(max=len(self.rows) - 1)
        return self.contents()[index], {"index": index}

    def contents(self) -> TensorDict:
        return torch.stack(self.rows, 0).clone()


def adapter() -> Adapter:
    def make(spec: BufferSpec) -> ListBuffer:
        if spec.sampler != "random":
            raise NotImplementedError(f"spec.sampler={spec.sampler!r}, but ListBuffer only samples uniformly")
        return ListBuffer(spec.capacity, spec.seed)

    return Adapter(name="list-buffer", version="0.1", make=make, capabilities=frozenset({"random"}))
