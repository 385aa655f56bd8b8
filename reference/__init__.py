"""rbcheck's reference replay buffer: small, readable, and the spec.

Each module holds one concept with its contract and cost; ``variants/`` must agree with them.
The buffer is every module but ``policy.py``, ``collector.py`` and ``env.py`` (policy placement
and a tiny collector over a toy environment, which use the buffer and are not part of it).
"""

from .buffer import ReplayBuffer
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .collector import SyncCollector
from .env import ChainEnv
from .pinning import pin_sample, require_accelerator
from .policy import NotCopyableError, make_target_params, place_policy
from .prioritized_sampler import PrioritizedSampler
from .random_sampler import RandomSampler
from .slice_sampler import SliceSampler
from .storage import TensorStorage
from .sum_tree import MinTree, SumTree
from .transforms import Compose, Transform
from .writer import RoundRobinWriter

__all__ = [
    "ChainEnv", "CheckpointError", "Compose", "MinTree", "NotCopyableError", "PrioritizedSampler",
    "RandomSampler", "ReplayBuffer", "RoundRobinWriter", "SliceSampler", "SumTree", "SyncCollector",
    "TensorStorage", "Transform", "load_checkpoint", "make_target_params", "pin_sample",
    "place_policy", "require_accelerator", "save_checkpoint",
]
