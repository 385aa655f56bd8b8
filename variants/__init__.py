"""Optimized replay buffers with the reference's public shape.

``ReplayBuffer`` keeps storage, writer generations and the prioritized trees
on one device (CUDA when present, else the CPU) and writes/samples whole
batches at once; ``PrioritizedSampler(..., backend="triton")`` runs the tree
descent and update as Triton kernels. On the CPU the trees' descent (AVX2 where
the CPU has it) and update and the sample's row gathers run in C
(``rbcheck.variants.native``, compiled on first use with the system C compiler and
cached per user; without one the torch path runs and
``rbcheck.variants.native.unavailable_reason()`` says why), the storage keeps the
fields of a row side by side, and the writer computes sampled slots'
generations from its write count.
Every component subclasses the reference's, keeps its ``state_dict`` layout
and its random stream, and is checked against it in ``tests/variants`` and by the conformance suite
(``pytest rbcheck/conformance --impl device`` / ``--impl triton``).
"""

from rbcheck.variants.buffer import ReplayBuffer
from rbcheck.variants.device_storage import DeviceStorage, DeviceWriter, default_device
from rbcheck.variants.prioritized import PrioritizedSampler
from rbcheck.variants.random_sampler import RandomSampler
from rbcheck.variants.slice import SliceSampler
from rbcheck.variants.vector_tree import VectorMinTree, VectorSumTree

__all__ = [
    "DeviceStorage", "DeviceWriter", "PrioritizedSampler", "RandomSampler",
    "ReplayBuffer", "SliceSampler", "VectorMinTree", "VectorSumTree", "default_device",
]
