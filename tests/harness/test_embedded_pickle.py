"""The no-pickle property sees a pickle stored inside a container file (as
tianshou's HDF5 checkpoints store a RandomState and a SegmentTree): a stream
that imports something, anywhere in the bytes, and not random tensor bytes."""

from __future__ import annotations

import pickle
import zipfile
from collections import OrderedDict

import numpy as np

from rbcheck.conformance.test_checkpoint_roundtrip import embedded_pickle


def test_a_pickle_inside_other_bytes_is_found_where_it_starts():
    payload = pickle.dumps(OrderedDict(a=1))  # imports collections.OrderedDict
    blob = b"\x89HDF\r\n\x1a\n" + bytes(100) + payload + bytes(50)
    assert embedded_pickle(blob) == 108


def test_a_pickle_stored_uncompressed_in_a_zip_is_found(tmp_path):
    path = tmp_path / "c.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("state.pkl", pickle.dumps(np.random.RandomState(0)))
    assert embedded_pickle(path.read_bytes()) is not None


def test_tensor_bytes_and_plain_values_are_not_pickles():
    noise = np.random.default_rng(0).standard_normal(100_000).astype(np.float32).tobytes()
    assert embedded_pickle(noise + b"\x80\x04\x95" + noise[:64]) is None
    assert embedded_pickle(pickle.dumps([1, 2.5, "x"])) is None  # imports nothing
