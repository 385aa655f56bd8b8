"""rbcheck's reference replay buffer: small, readable, and the spec.

Each module holds one concept with its contract and cost; ``variants/`` must agree with them.
The buffer is every module but ``policy.py``, ``collector.py`` and ``env.py`` (policy placement
and a tiny collector over a toy environment, which use the buffer and are not part of it).
"""

from rbcheck.reference.buffer import ReplayBuffer
from rbcheck.reference.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rbcheck.reference.collector import SyncCollector
from rbcheck.reference.compressed_storage import CompressedStorage
from rbcheck.reference.consuming_sampler import ConsumingSampler, ConsumingWriter
from rbcheck.reference.env import ChainEnv
from rbcheck.reference.iteration import Prefetch, iterate
from rbcheck.reference.max_value_writer import MaxValueWriter
from rbcheck.reference.memmap_storage import MemmapStorage, StorageFileError
from rbcheck.reference.pinning import pin_sample, require_accelerator
from rbcheck.reference.policy import NotCopyableError, make_target_params, place_policy
from rbcheck.reference.prioritized_sampler import PrioritizedSampler
from rbcheck.reference.random_sampler import RandomSampler
from rbcheck.reference.slice_sampler import SliceSampler
from rbcheck.reference.storage import TensorStorage
from rbcheck.reference.sum_tree import MinTree, SumTree
from rbcheck.reference.transforms import Compose, Transform
from rbcheck.reference.without_replacement_sampler import WithoutReplacementSampler
from rbcheck.reference.writer import ImmutableWriter, RoundRobinWriter, WriteRefusedError

__all__ = [
    "ChainEnv", "CheckpointError", "Compose", "ConsumingSampler", "ConsumingWriter", "MinTree",
    "NotCopyableError", "Prefetch", "PrioritizedSampler", "RandomSampler", "ReplayBuffer",
    "RoundRobinWriter", "SliceSampler", "SumTree", "SyncCollector", "TensorStorage", "Transform",
    "WithoutReplacementSampler", "iterate", "load_checkpoint", "make_target_params", "pin_sample",
    "place_policy", "require_accelerator", "save_checkpoint",
]
__all__ += ["ImmutableWriter", "MaxValueWriter", "MemmapStorage", "StorageFileError", "WriteRefusedError"]
# issue 40: slice epochs, prioritized slices, staleness
from rbcheck.reference.prioritized_slice_sampler import PrioritizedSliceSampler  # noqa: E402
from rbcheck.reference.slice_without_replacement_sampler import SliceWithoutReplacementSampler  # noqa: E402
from rbcheck.reference.staleness_sampler import StalenessSampler  # noqa: E402

__all__ += ["PrioritizedSliceSampler", "SliceWithoutReplacementSampler", "StalenessSampler"]
__all__ += ["CompressedStorage"]
# issue 42: served replay (Reverb's table model)
from rbcheck.reference.served_table import RateLimiterTimeout, ServedTable  # noqa: E402

__all__ += ["RateLimiterTimeout", "ServedTable"]
# issue 42: hindsight relabelling, offline-to-online mixing
from rbcheck.reference.her import HindsightReplayBuffer  # noqa: E402
from rbcheck.reference.mixing import MixingReplayBuffer  # noqa: E402

__all__ += ["HindsightReplayBuffer", "MixingReplayBuffer"]
