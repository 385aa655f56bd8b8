"""cpprb 11.0.0's ``ReplayBuffer(mmap_prefix=...)`` as the built-in ``cpprb-mmap`` (issue 41).

Line numbers are of cpprb 11.0.0's ``src/cpprb/PyReplayBuffer.pyx`` (the repository's at
version 11.0.0; the wheel ships it compiled).

Mapping (everything else as :mod:`rbcheck.harness.adapters.cpprb`'s uniform ``cpprb``):

* ``storage="memmap"``: ``ReplayBuffer(capacity, env_dict,
  mmap_prefix=<scratch_dir>/cpprb)`` (``__cinit__``, pyx:961-963, handed to ``dict2buffer``, pyx:998). Each field
  is ``np.memmap(f"{mmap_prefix}_{name}.dat", mode="w+")`` (pyx:515-516), made at
  construction and filled with 1 (pyx:538); a leaf's name is its key joined by ``.``
  (``cpprb_next.done.dat``: cpprb's own ``/`` would name a subdirectory). cpprb does not make
  the directory. The ring position, the stored size and the episode bookkeeping live in C++
  (``RingBufferIndex``), never in the files.
* ``storage="memory"`` (the ring, ownership and model-comparison properties every column
  runs): the same class with its files in a private temporary directory, removed at exit.
* ``close()``: cpprb has no close; a user ends such a buffer by dropping it (NumPy flushes and
  unmaps each ``memmap`` when it is freed), so ``close()`` drops it.
* ``spec.reopen``: not possible with cpprb: every construction opens its files with
  ``mode="w+"`` (pyx:515-516, truncated, then filled with 1 at pyx:538) and the cursor and size
  are in C++ memory only, so ``make(spec.but(reopen=True))`` raises ``NotImplementedError``
  saying so. ``save_transitions``/``load_transitions`` (pyx:1209/:1297) are a transition export
  that loses the ring position, not a reopen, and are not used.
* files are not checked by cpprb: a file removed under the buffer is still mapped (its inode
  lives on), a truncated one is written past its end (docs/bugs.toml).
"""

from __future__ import annotations

import atexit
import importlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rbcheck.harness.adapters.cpprb import SRC, UNIFORM_CAPABILITIES, CpprbBuffer, _version
from rbcheck.harness.protocol import Adapter, BufferSpec

KNOWN_FAILURES = Path(__file__).resolve().parent.parent / "known_failures" / "cpprb-mmap.txt"
PREFIX = "cpprb"  # the files: <scratch_dir>/cpprb_<field>.dat
NO_REOPEN = (f"{SRC}'s ReplayBuffer cannot open its mmap_prefix files again: every construction opens them "
             "with mode='w+' (PyReplayBuffer.pyx:515-516, truncated, then filled with 1 at :538) and its "
             "cursor and size live in C++ memory only")


class CpprbMmapBuffer(CpprbBuffer):
    """cpprb's uniform ``ReplayBuffer`` with every field a memory-mapped file."""

    SEP = "."

    def __init__(self, spec: BufferSpec):
        if spec.storage == "memmap":
            if not spec.scratch_dir:
                raise ValueError(f"spec.scratch_dir={spec.scratch_dir!r}, but should be a directory "
                                 "(storage='memmap')")
            directory = spec.scratch_dir
        elif spec.storage == "memory":
            directory = tempfile.mkdtemp(prefix="rbcheck-cpprb-")
            atexit.register(shutil.rmtree, directory, True)
        else:
            raise ValueError(f"spec.storage={spec.storage!r}, but should be 'memory' or 'memmap' (cpprb-mmap)")
        if spec.reopen:
            raise NotImplementedError(f"spec.reopen=True: {NO_REOPEN}")
        self.prefix = str(Path(directory) / PREFIX)
        super().__init__(spec)

    def _construct(self, env_dict: dict[str, dict[str, Any]]) -> Any:
        cpprb = importlib.import_module("cpprb")
        return cpprb.ReplayBuffer(self.spec.capacity, env_dict, mmap_prefix=self.prefix)

    def close(self) -> None:
        self.rb = None  # NumPy flushes and unmaps each memmap as it is freed


def _make(spec: BufferSpec) -> CpprbMmapBuffer:
    if spec.sampler != "random":
        raise ValueError(f"spec.sampler={spec.sampler!r}, but should be 'random' (cpprb-mmap)")
    return CpprbMmapBuffer(spec)


def cpprb_mmap_adapter() -> Adapter:
    """cpprb's uniform ``ReplayBuffer`` with ``mmap_prefix`` in the scratch directory."""
    return Adapter(name="cpprb-mmap", version=_version(), make=_make,
                   capabilities=UNIFORM_CAPABILITIES | {"memmap"},
                   known_failures=KNOWN_FAILURES if KNOWN_FAILURES.exists() else None)


__all__ = ["CpprbMmapBuffer", "cpprb_mmap_adapter"]
