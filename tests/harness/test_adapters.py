"""The adapter registry, the loader's errors, the generic reference-shaped
wrapper and the TorchRL adapter's honesty about what cannot run here."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
from tensordict import TensorDict

from rbcheck.harness.adapters import AdapterLoadError, builtin_names, load_adapter
from rbcheck.harness.adapters.reference import buffer_adapter, cuda_unavailable_reason
from rbcheck.harness.protocol import CAPABILITIES, Adapter, BufferSpec

HAS_TORCHRL = importlib.util.find_spec("torchrl") is not None
needs_torchrl = pytest.mark.skipif(not HAS_TORCHRL, reason="torchrl is not installed")


def rows(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"obs": torch.arange(start, start + n, dtype=torch.float32)}, [n])


def test_builtin_names_start_with_the_reference():
    names = builtin_names()
    assert names[0] == "reference"
    assert "torchrl" in names


def test_reference_declares_everything_and_cuda_only_where_it_runs():
    adapter = load_adapter("reference")
    # all but "concurrent": the reference is not thread-safe (harness/concurrency.py)
    assert adapter.capabilities == CAPABILITIES - {"concurrent"}
    assert ("cuda" in adapter.unavailable) == (not torch.cuda.is_available())
    assert set(adapter.unavailable) <= {"cuda"}


def test_factory_path_loads_the_same_adapter():
    adapter = load_adapter("rbcheck.harness.adapters.reference:reference_adapter")
    assert isinstance(adapter, Adapter) and adapter.name == "reference"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("", "impl='', but should be a built-in name"),
        ("nosuch", "impl='nosuch', but should be a built-in name (reference, device, triton, torchrl"),
        ("nosuch_pkg.module:factory", "module 'nosuch_pkg.module' could not be imported (ModuleNotFoundError"),
        ("rbcheck.harness.adapters:nope", "module 'rbcheck.harness.adapters' has no attribute 'nope'"),
        ("rbcheck.harness.adapters:", "but should be a built-in name"),
        ("rbcheck.harness.protocol:CAPABILITIES", "is a frozenset, but should be a factory function"),
        ("rbcheck_fake_mod:returns_int", "returns_int() returned a int, but should return a harness.protocol.Adapter"),
    ],
)
def test_bad_names_raise_a_clear_error(name, expected, monkeypatch):
    fake = types.ModuleType("rbcheck_fake_mod")
    fake.returns_int = lambda: 3
    monkeypatch.setitem(sys.modules, "rbcheck_fake_mod", fake)
    with pytest.raises(AdapterLoadError) as info:
        load_adapter(name)
    assert expected in str(info.value)


def test_buffer_adapter_wraps_a_reference_shaped_class():
    from rbcheck.reference.buffer import ReplayBuffer

    adapter = buffer_adapter("mine", "1.0", ReplayBuffer, {"random", "prioritized"}, pin_module=None)
    assert adapter.patch_pin_step is None and adapter.unavailable == {}
    buf = adapter.make(BufferSpec(capacity=4, batch_size=2))
    assert buf.extend(rows(6)).tolist() == [0, 1, 2, 3, 0, 1]
    assert buf.add(TensorDict({"obs": torch.tensor(9.0)}, [])) == 2
    assert (len(buf), buf.cursor, buf.write_count) == (4, 3, 7)
    assert buf.contents()["obs"].tolist() == [4.0, 5.0, 9.0, 3.0]
    prio = adapter.make(BufferSpec(capacity=4, sampler="prioritized", alpha=1.0, eps=0.0))
    prio.extend(rows(4))
    prio.update_priority(torch.tensor([1]), torch.tensor([3.0]))
    assert prio.stored_priority(torch.tensor([0, 1])).tolist() == [1.0, 3.0]
    assert prio.max_priority == 3.0
    assert prio.indices_from_uniforms(torch.tensor([0.0, 0.99], dtype=torch.float64)).tolist() == [0, 3]


def test_reference_pin_step_patch_lifts_the_accelerator_check_and_records():
    adapter = load_adapter("reference")
    handed = []

    def recorder(sample, info):
        handed.append((sample.clone(), dict(info)))
        return sample, info

    with adapter.patch_pin_step(recorder):
        buf = adapter.make(BufferSpec(capacity=4, batch_size=2, pin_memory=True))
        buf.extend(rows(4))
        buf.sample()
    assert len(handed) == 1 and set(handed[0][1]) >= {"index"}
    if cuda_unavailable_reason():
        with pytest.raises(RuntimeError, match="pin_memory"):
            adapter.make(BufferSpec(capacity=4, pin_memory=True))


def test_reference_place_policy_is_the_reference_hook():
    policy = torch.nn.Linear(1, 1)
    assert load_adapter("reference").place_policy(policy, torch.device("cpu"), True) is policy


# ---------------------------------------------------------------- TorchRL


@pytest.fixture(scope="module")
def torchrl_adapter():
    if not HAS_TORCHRL:
        pytest.skip("torchrl is not installed")
    return load_adapter("torchrl")


def test_torchrl_declares_only_what_it_has(torchrl_adapter):
    caps = torchrl_adapter.capabilities
    assert {"random", "slice", "prioritized", "save_load", "pin_memory"} <= caps
    assert not caps & {"shared_rng", "stale_updates"}  # no given uniforms, no generations
    assert torchrl_adapter.known_failures is not None and torchrl_adapter.known_failures.name == "torchrl.txt"


def test_torchrl_prioritized_is_unavailable_exactly_when_it_cannot_be_built(torchrl_adapter):
    from rbcheck.harness.adapters.torchrl import probe_prioritized

    why = probe_prioritized()
    assert torchrl_adapter.unavailable.get("prioritized") == why
    if why is not None:
        # the real error, not a paraphrase; and no machine paths in it
        assert why.split(":")[0] in {"RuntimeError", "ImportError", "OSError"}
        assert "/" not in why.split("(cause:")[0]
        assert torchrl_adapter.unavailable["priority_key"].endswith(why)
        assert not torchrl_adapter.has("prioritized")


def test_torchrl_round_trip_hides_only_its_own_index_column(torchrl_adapter):
    buf = torchrl_adapter.make(BufferSpec(capacity=4, batch_size=3))
    data = rows(6)
    assert buf.extend(data).tolist() == [0, 1, 2, 3, 0, 1]
    assert list(data.keys()) == ["obs"]  # the caller's TensorDict is not written into
    assert (len(buf), buf.cursor, buf.write_count) == (4, 2, 6)
    assert list(buf.contents().keys()) == ["obs"]
    sample, info = buf.sample()
    assert list(sample.keys()) == ["obs"]
    assert torch.equal(sample["obs"], buf.contents()["obs"][info["index"]])
    with pytest.raises(NotImplementedError, match="generation"):
        buf.update_priority(torch.tensor([0]), torch.tensor([1.0]), generation=torch.tensor([0]))
    with pytest.raises(NotImplementedError, match="shared_rng"):
        buf.indices_from_uniforms(torch.tensor([0.5], dtype=torch.float64))


def test_torchrl_pin_step_patch_keeps_torchrls_decision(torchrl_adapter):
    handed = []

    def recorder(sample, info):
        handed.append((type(sample).__name__, sample.device, dict(info)))
        return sample, info

    def drop_device(td):
        return TensorDict({"obs": td["obs"] * 2}, batch_size=td.batch_size, device=None)

    with torchrl_adapter.patch_pin_step(recorder):
        buf = torchrl_adapter.make(BufferSpec(capacity=4, batch_size=2, pin_memory=True))
        buf.extend(rows(4))
        buf.sample()
        assert handed == [("TensorDict", torch.device("cpu"), {})]  # the info is never handed over
        handed.clear()
        buf = torchrl_adapter.make(
            BufferSpec(capacity=4, batch_size=2, pin_memory=True, transform=drop_device)
        )
        buf.extend(rows(4))
        buf.sample()
        assert handed == []  # TorchRL does not pin a TensorDict whose device is None


def test_one_table_says_which_built_ins_are_rbchecks_own():
    from rbcheck.harness.adapters import BUILTIN, is_first_party

    own = {name for name in BUILTIN if is_first_party(name)}
    assert own == {"reference", "device", "triton", "example"}, f"first-party built-ins={sorted(own)}"
    assert not is_first_party("mypkg.buffers:adapter"), "a user's factory is not rbcheck's own"
    assert not is_first_party("not-a-builtin")
