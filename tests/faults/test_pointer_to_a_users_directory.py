"""A save never deletes a directory rbcheck did not create (exact; issue 39,
item 7).

``dumps`` removed the sub-directory the previous ``CURRENT`` named once it
held only ``meta.json`` and ``tensors.safetensors``, and the pointer check
took any ``ckpt-[A-Za-z0-9_]+``: with ``CURRENT`` naming ``ckpt-best/`` (the
user's copy of their best checkpoint), a save deleted it. Only the names
rbcheck's save generates (``ckpt-rbcheck_<16 hex>``) are rbcheck's; a
``CURRENT`` naming anything else is in doubt, so the save (of the reference
and of the ``device`` and ``triton`` variants) refuses: ``CheckpointError``
naming ``CURRENT`` with "but should", and the directory byte-identical.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rbcheck.harness.adapters import load_adapter
from rbcheck.harness.protocol import BufferSpec
from rbcheck.reference import CheckpointError

from ..unit.test_buffer import same
from ..variants.common import cpu, rows

IMPLS = ("reference", "device", "triton")
SPEC = BufferSpec(capacity=8, sampler="prioritized", alpha=0.7, beta=0.5, eps=1e-3, seed=3)
#: Names a user (or an older rbcheck, whose mkdtemp names had 8 characters)
#: may give a directory, none of them what today's save generates.
NAMES = ("ckpt-best", "ckpt-legacy01", "ckpt-rbcheck_mine", "ckpt-rbcheck_0123456789ABCDEF",
         "ckpt-rbcheck_0123456789abcdef0")


def tree(path: Path) -> dict[str, bytes | None]:
    """Every entry under ``path``: a file's bytes, None for a directory."""
    return {p.relative_to(path).as_posix(): None if p.is_dir() else p.read_bytes() for p in path.rglob("*")}


def adapter(name: str):
    impl = load_adapter(name)
    if not impl.has("save_load"):
        pytest.skip(f"{name}: save_load unavailable: {impl.unavailable.get('save_load', 'not declared')}")
    return impl


@pytest.mark.parametrize("user_name", NAMES)
@pytest.mark.parametrize("name", IMPLS)
def test_save_over_a_pointer_to_a_users_directory_deletes_nothing(name, user_name, tmp_path):
    """``CURRENT`` names the user's directory, which holds exactly a
    checkpoint's two files (their copy of a good checkpoint, which loads): the
    save refuses, naming ``CURRENT``, and nothing under the directory changes."""
    impl = adapter(name)
    buf = impl.make(SPEC)
    buf.extend(rows(5))
    path = tmp_path / "run"
    buf.save(tmp_path / "first")
    live = tmp_path / "first" / (tmp_path / "first" / "CURRENT").read_text().strip()
    path.mkdir()
    shutil.copytree(live, path / user_name)
    (path / "CURRENT").write_text(f"{user_name}\n")
    before = tree(path)
    buf.extend(rows(2, 30))
    with pytest.raises(CheckpointError, match=r"CURRENT=.*but should") as caught:
        buf.save(path)
    assert user_name in str(caught.value)
    assert tree(path) == before, "a refused save changed the directory"
    other = impl.make(SPEC.but(seed=9))
    other.load(path)  # the user's directory still loads: reading it deletes nothing
    assert len(other) == 5


@pytest.mark.parametrize("name", IMPLS)
def test_save_over_its_own_checkpoint_replaces_it(name, tmp_path):
    """Control: a save over rbcheck's own checkpoint removes the previous one
    (its generated name) and leaves exactly the pointer and the new one."""
    impl = adapter(name)
    buf = impl.make(SPEC)
    buf.extend(rows(5))
    buf.save(tmp_path / "run")
    first = (tmp_path / "run" / "CURRENT").read_text().strip()
    buf.extend(rows(2, 30))
    buf.save(tmp_path / "run")
    second = (tmp_path / "run" / "CURRENT").read_text().strip()
    assert first != second and sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(["CURRENT", second])
    other = impl.make(SPEC.but(seed=9))
    other.load(tmp_path / "run")
    assert same(cpu(other.buffer.state_dict()), cpu(buf.buffer.state_dict()))
