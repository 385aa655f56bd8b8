"""rbcheck's pytest plugin: which implementation is under test, and how its
results are reported. It is on only when a session asks for it (``-p rbcheck``,
``--impl`` or ``RBCHECK_IMPL``; see ``rbcheck.plugin``, which adds the options).

Options (each with an environment variable):

* ``--impl NAME`` (``RBCHECK_IMPL``, default ``reference``): a built-in name
  (``rbcheck.harness.adapters.builtin_names()``) or ``pkg.module:factory``.
* ``--rbcheck-profile {ci,dev,thorough}`` (``RBCHECK_PROFILE``, default
  ``dev``): the Hypothesis settings profile.
* ``--rbcheck-device DEVICE`` (``RBCHECK_DEVICE``, default ``cpu``): where
  the buffers under test live; every ``BufferSpec`` the properties build
  with the default ``device="cpu"`` is moved there (``cuda`` needs the
  ``cuda`` capability and is skipped as unavailable without a GPU).
* ``--rbcheck-results PATH``: write every test outcome as JSON (read by
  ``python -m rbcheck.harness.report``), with pytest's exit status and the
  errors outside the tests (a usage error the plugin raised, a collection
  error, an internal error, an interrupt) that ``harness.verdict`` judges.
* ``--rbcheck-known-failures PATH``: a known-failures file to use instead of
  the adapter's own (``harness/known_failures/<name>.txt``).
* ``--rbcheck-progress``: one line to stderr per property as it finishes.

Fixtures: ``impl`` (the Adapter), ``make_buffer(spec=None, **fields)``,
``reference_impl`` (the reference Adapter, the model). Marker:
``@pytest.mark.requires("prioritized", ...)``: the test is skipped with
``"not declared: <cap>"`` when the adapter does not declare a capability and
``"unavailable: <cap>: <why>"`` when it declares it but it cannot run here;
the results file records the latter as ``unavailable``, never as a pass.
Marker ``@pytest.mark.conventions("priority_dtype", ...)``: the declared
conventions (``Adapter.conventions``) the test checks its invariant under;
the deviations among them are recorded with the result and shown next to it
in the report. Marker ``@pytest.mark.exact_replay``: the test replays draws
exactly (same seed -> same draws); skipped with ``"convention: not
seedable"`` when the adapter declares ``seedable=False``.

Known failures are keyed by cause. A known-failures file holds entries of
three lines::

    test_x.py::test_y
        message: <regex searched in the failure message>
        reason: <one line> (<link>)

The id is a property id (``test_x::test_y``, as ``rbcheck list`` prints it), a
node id (``rbcheck/conformance/test_x.py::test_y[p]``) or its tail
(``test_x.py::test_y``, ``test_y``); without ``[...]`` it covers every
parametrization, and each is judged on its own: one that passes is XPASS
even where a sibling still fails (name the failing parametrizations,
``test_x::test_y[p]``, when only some fail). ``message`` is a Python regex searched (``re.search``) in
``"<ExceptionType>: <message>"`` of the failure, the repro snippet attached
to it left out (every sub-exception of an exception group must match). A failure whose message matches is reported as
``xfail`` with the reason; a pass is ``XPASS`` (update the file); a failure
with any other message stays a failure, and its message says that a known
failure hid something new. An id that matches no collected test warns.

No entry may hide a seed bug (DESIGN.md, "The seed invariants"): an entry
naming a test of a seed invariant (:data:`SEED_INVARIANTS`) is a usage error;
those failures always show as FAIL.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from rbcheck.harness.adapters import AdapterLoadError, load_adapter
from rbcheck.harness.protocol import CAPABILITIES, Adapter, BufferSpec
from rbcheck.plugin import DEFAULT_IMPL, DEFAULT_PROFILE, PROFILES

RESULTS_SCHEMA = 1


class KnownFailureWarning(pytest.PytestWarning):
    """A known-failures entry that matches no collected test."""


# --------------------------------------------------------------------------
# Hypothesis profiles
# --------------------------------------------------------------------------


def register_profiles() -> None:
    """ci: few examples, derandomized, no database (reproducible and fast on
    2 cores); dev: the default; thorough: many examples, for a nightly run."""
    from hypothesis import HealthCheck, settings

    quiet = [HealthCheck.too_slow, HealthCheck.data_too_large]
    settings.register_profile(
        "ci",
        max_examples=20,
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=quiet,
    )
    settings.register_profile(
        "dev", max_examples=50, deadline=None, print_blob=True, suppress_health_check=quiet
    )
    settings.register_profile(
        "thorough", max_examples=1000, deadline=None, print_blob=True, suppress_health_check=quiet
    )


# --------------------------------------------------------------------------
# Known failures
# --------------------------------------------------------------------------


#: Tests of the five seed invariants (DESIGN.md), relative to the suite: a
#: whole file, or ``file::test``. No known-failure entry may name them.
SEED_INVARIANTS = {
    "test_checkpoint_roundtrip.py": "1 (save -> load exact; plain JSON, no pickle)",
    "test_priority_transform.py": "2 (a priority is transformed exactly once)",
    "test_pin_memory.py": "3 (pin_memory pins the returned sample, or is a clear error)",
    "test_policy_placement.py": "4 (a non-copyable policy is used in place or a clear error)",
    "test_trajectory_slices.py::test_trajectory_example_runs_as_written": "5 (the tutorial runs)",
}
KNOWN_FAILURE_KEYS = ("message", "reason")


class KnownFailureError(ValueError):
    """A known-failures file that cannot be used (bad syntax, bad regex, no
    message pattern, or an entry on a seed invariant)."""


@dataclass
class KnownFailure:
    """One known failure: the tests ``test_id`` names fail, each with a
    message ``pattern`` finds, for ``reason``. The one model behind a
    known-failures file and ``rbcheck.check_buffer``'s ``expected_failures``;
    build one with :func:`known_failure`. ``where`` says where it was
    declared (``file:line``, ``expected_failures[i]``)."""

    test_id: str
    pattern: re.Pattern
    reason: str
    line: int
    matched: int = 0
    where: str = ""

    def explains(self, messages: list[str]) -> bool:
        """Whether every failure message is this entry's known cause."""
        return bool(messages) and all(self.pattern.search(m) for m in messages)


def known_failure(test_id: str, message: str, reason: str, where: str, line: int = 0) -> KnownFailure:
    """A checked :class:`KnownFailure`. ``message`` must be a regex that
    names a cause: one that matches an empty message (``""``, ``.*``, ``x?``)
    would match every failure and is refused, as is an empty ``reason``.
    Raises :class:`KnownFailureError` naming ``where``."""
    label = f"known failure id={test_id!r} ({where})"
    try:
        pattern = re.compile(message.strip())
    except re.error as err:
        raise KnownFailureError(
            f"{label}: message={message!r} is not a valid regex ({err}), but should be one"
        ) from err
    if pattern.search(""):
        raise KnownFailureError(
            f"{label}: message={message!r} matches an empty message, so every failure, but should be "
            f"a regex naming the failure's cause (e.g. '^AssertionError: len\\(buf\\)=')"
        )
    if not reason.strip():
        raise KnownFailureError(
            f"{label}: reason={reason!r}, but should be a non-empty reason (a link to the issue, say)"
        )
    return KnownFailure(test_id, pattern, reason.strip(), line, where=where)


def parse_known_failures(path: Path) -> list[KnownFailure]:
    """Entries of a known-failures file (see module doc). Raises
    :class:`KnownFailureError` naming the file and line of a bad entry."""
    entries: list[KnownFailure] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        if current is None:
            return
        where = f"{path}:{current['line']}"
        if "message" not in current:
            raise KnownFailureError(
                f"known failure id={current['id']!r} ({where}) has no 'message:' line, but should "
                f"name the pattern of its failure message (known failures are keyed by cause)"
            )
        entries.append(known_failure(current["id"], current["message"],
                                     current.get("reason") or "no reason given", where, current["line"]))

    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        if raw[0].isspace():
            key, sep, value = text.partition(":")
            if current is None or not sep or key.strip() not in KNOWN_FAILURE_KEYS:
                raise KnownFailureError(
                    f"{path}:{number}: {text!r}, but should be an indented 'message: <regex>' or "
                    f"'reason: <text>' line under a test id"
                )
            current[key.strip()] = value.strip()
            continue
        close()
        if "#" in text or " " in text:
            raise KnownFailureError(
                f"{path}:{number}: {text!r}, but should be a test id alone on its line, followed by "
                f"indented 'message: <regex>' and 'reason: <text>' lines"
            )
        current = {"id": property_to_file_id(text), "line": number}
    close()
    return entries


def seed_invariant_of(nodeid: str) -> str | None:
    """The seed invariant a test checks, or None."""
    rel = suite_relative(nodeid).split("[", 1)[0]
    for key, invariant in SEED_INVARIANTS.items():
        if rel == key or rel.startswith(key + "::") or (rel.split("::", 1)[0] == key.split("::", 1)[0]
                                                        and rel.endswith("::" + key.split("::")[-1])):
            return invariant
    return None


def property_to_file_id(test_id: str) -> str:
    """A property id (``test_x::test_y``, as ``rbcheck list`` prints) as the
    file form (``test_x.py::test_y``); other ids are returned unchanged."""
    head, sep, tail = test_id.partition("::")
    if sep and "/" not in head and not head.endswith(".py"):
        return f"{head}.py::{tail}"
    return test_id


def suite_relative(nodeid: str) -> str:
    """``nodeid`` relative to the conformance suite (``test_x.py::test_y[p]``),
    wherever the suite was collected from (a checkout or an installed rbcheck);
    other node ids are returned unchanged."""
    head, sep, tail = nodeid.partition("::")
    parts = head.split("/")
    if "conformance" in parts[:-1]:
        cut = len(parts) - 1 - parts[::-1].index("conformance")
        return "/".join(parts[cut + 1:]) + sep + tail
    return nodeid


def in_suite(nodeid: str) -> bool:
    """Whether ``nodeid`` is a test of the conformance suite."""
    return suite_relative(nodeid) != nodeid


def id_matches(test_id: str, nodeid: str) -> bool:
    """Whether a known-failure id names ``nodeid`` (see module doc)."""
    candidates = [nodeid]
    if "[" not in test_id and "[" in nodeid:
        candidates.append(nodeid.split("[", 1)[0])
    return any(
        c == test_id or c.endswith("/" + test_id) or c.endswith("::" + test_id) for c in candidates
    )


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------


@dataclass
class State:
    impl_name: str
    adapter: Adapter
    profile: str
    results_path: Path | None
    known_failures_path: Path | None
    known_failures: list[KnownFailure] = field(default_factory=list)
    device: str = "cpu"
    previous_profile: str | None = None
    progress: bool = False
    pending: dict[str, int] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    hid_new: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # outside the tests: usage, collection, internal, interrupt
    shrink_seconds: float | None = None
    started: float = 0.0


#: Known failures handed to ``rbcheck.check_buffer`` (its ``expected_failures``),
#: by the ``--impl`` name of its in-process run: used instead of the adapter's
#: own known-failures file (removed after the run).
EXPECTED: dict[str, list[KnownFailure]] = {}

_STATE_KEY = pytest.StashKey[State]()
_KNOWN_KEY = pytest.StashKey[KnownFailure]()
_current: State | None = None
#: States of enclosing sessions (``rbcheck.check_buffer`` runs pytest inside pytest).
_outer: list[State | None] = []


def adapter_under_test() -> Adapter:
    """The adapter selected for this pytest run (for code that runs at
    collection time, e.g. a strategy that depends on capabilities)."""
    if _current is None:
        return load_adapter(os.environ.get("RBCHECK_IMPL", DEFAULT_IMPL))
    return _current.adapter


def pytest_configure(config: pytest.Config) -> None:
    global _current
    config.addinivalue_line(
        "markers",
        "requires(*capabilities): skip unless the implementation under test declares "
        "the capabilities and they can run here",
    )
    config.addinivalue_line(
        "markers",
        "conventions(*names): the declared conventions this test checks its invariant under "
        "(shown with its result in the report)",
    )
    config.addinivalue_line(
        "markers",
        "exact_replay: the test needs seeded draws; skipped for an adapter declaring seedable=False",
    )
    impl_name = config.getoption("rbcheck_impl") or os.environ.get("RBCHECK_IMPL") or DEFAULT_IMPL
    profile = (
        config.getoption("rbcheck_profile") or os.environ.get("RBCHECK_PROFILE") or DEFAULT_PROFILE
    )
    if profile not in PROFILES:
        raise pytest.UsageError(
            f"rbcheck profile={profile!r}, but should be one of {', '.join(PROFILES)}"
        )
    try:
        adapter = load_adapter(impl_name)
    except AdapterLoadError as err:
        raise pytest.UsageError(str(err)) from err
    except Exception as err:  # a factory that crashed
        raise pytest.UsageError(
            f"impl={impl_name!r}: loading the adapter raised {type(err).__name__}: {err}"
        ) from err

    register_profiles()
    from hypothesis import settings

    previous_profile = getattr(settings, "_current_profile", None)
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile(profile)

    device = config.getoption("rbcheck_device") or os.environ.get("RBCHECK_DEVICE") or "cpu"
    try:
        torch_device = torch.device(device)
    except RuntimeError as err:
        raise pytest.UsageError(
            f"rbcheck device={device!r}, but should be a torch device such as 'cpu' or 'cuda' ({err})"
        ) from err
    if torch_device.type not in ("cpu", "cuda"):
        raise pytest.UsageError(f"rbcheck device={device!r}, but should be 'cpu' or 'cuda[:N]'")

    if device != "cpu":
        adapter = on_device(adapter, device)

    results = config.getoption("rbcheck_results")
    override = config.getoption("rbcheck_known_failures")
    kf_path = Path(override) if override else adapter.known_failures
    state = State(
        impl_name=impl_name,
        adapter=adapter,
        profile=profile,
        results_path=Path(results) if results else None,
        known_failures_path=Path(kf_path) if kf_path else None,
        device=device,
        previous_profile=previous_profile,
        progress=bool(config.getoption("rbcheck_progress", default=False)),
    )
    if impl_name in EXPECTED:  # check_buffer's expected_failures, fresh counts for this run
        state.known_failures_path = None
        state.known_failures = [replace(entry, matched=0) for entry in EXPECTED[impl_name]]
    elif state.known_failures_path is not None:
        if not state.known_failures_path.exists():
            raise pytest.UsageError(
                f"known failures file={str(state.known_failures_path)!r} does not exist, "
                f"but should be a text file of test ids"
            )
        try:
            state.known_failures = parse_known_failures(state.known_failures_path)
        except KnownFailureError as err:
            raise pytest.UsageError(str(err)) from err
    state.shrink_seconds = shrink_budget(config, impl_name)
    apply_shrink_budget(state.shrink_seconds)
    config.stash[_STATE_KEY] = state
    _outer.append(_current)
    _current = state


#: rbcheck's own implementations: their counterexamples are shrunk to the minimum.
OWN_IMPLEMENTATIONS = frozenset({"reference", "device", "triton"})
#: seconds Hypothesis may shrink one failing property of any other implementation
THIRD_PARTY_SHRINK_SECONDS = 1.0


def shrink_budget(config: pytest.Config, impl_name: str) -> float | None:
    """Seconds of shrinking per failing property: ``--rbcheck-shrink-seconds``
    / ``RBCHECK_SHRINK_SECONDS``, else None (Hypothesis' own limit) for
    rbcheck's own implementations and THIRD_PARTY_SHRINK_SECONDS for others:
    a buffer that fails much would otherwise spend minutes minimising
    counterexamples (each failing property may shrink for up to 5 minutes)."""
    raw = config.getoption("rbcheck_shrink_seconds", default=None) or os.environ.get("RBCHECK_SHRINK_SECONDS")
    if raw is None or raw == "":
        return None if impl_name in OWN_IMPLEMENTATIONS else THIRD_PARTY_SHRINK_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise pytest.UsageError(f"rbcheck shrink seconds={raw!r}, but should be a number >= 0")
    return value


def apply_shrink_budget(seconds: float | None) -> None:
    """Bound Hypothesis' shrinking of one failing test to ``seconds`` (its
    engine's per-test shrink deadline); 0 drops the shrink phase from the
    loaded profile. None leaves Hypothesis' defaults."""
    if seconds is None:
        return
    from hypothesis import Phase, settings
    from hypothesis.internal.conjecture import engine

    if seconds == 0 or not hasattr(engine, "MAX_SHRINKING_SECONDS"):
        phases = tuple(p for p in settings().phases if p is not Phase.shrink)
        settings.register_profile("rbcheck-no-shrink", settings(settings(), phases=phases))
        settings.load_profile("rbcheck-no-shrink")
        return
    engine.MAX_SHRINKING_SECONDS = seconds
    report = getattr(engine, "report", None)
    if callable(report) and not getattr(report, "rbcheck", False):
        def budget_report(text, *args, **kwargs):  # Hypothesis' note says "five minutes"
            if isinstance(text, str) and text.startswith("WARNING: Hypothesis has spent more than five"):
                text = (f"rbcheck: shrinking stopped after its budget of {engine.MAX_SHRINKING_SECONDS:g} s "
                        "(--rbcheck-shrink-seconds): the counterexample below may not be minimal")
            return report(text, *args, **kwargs)

        budget_report.rbcheck = True
        engine.report = budget_report


def on_device(adapter: Adapter, device: str) -> Adapter:
    """The adapter with every spec on the default device ("cpu") moved to
    ``device``; a test building one is skipped with the reason when the
    adapter cannot run there. The reference model stays on the CPU."""

    def make(spec: BufferSpec):
        if spec.device == "cpu":
            spec = spec.but(device=device)
        reason = capability_skip_reason(adapter, spec_capabilities(spec))
        if reason:
            pytest.skip(reason)
        return adapter.make(spec)

    return replace(adapter, make=make)


def pytest_unconfigure(config: pytest.Config) -> None:
    global _current
    state = config.stash.get(_STATE_KEY, None)
    if state is None:
        return
    if _outer:
        _current = _outer.pop()
    if state.previous_profile is not None:  # an enclosing session's profile, back
        from hypothesis import settings

        settings.load_profile(state.previous_profile)


def _state(config: pytest.Config) -> State:
    return config.stash[_STATE_KEY]


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = _state(config)
    adapter = state.adapter
    lines = [
        f"rbcheck implementation: {adapter.name} {adapter.version} (--impl {state.impl_name})",
        "rbcheck capabilities: " + (", ".join(sorted(adapter.capabilities)) or "(none)"),
    ]
    if adapter.unavailable:
        for cap, why in sorted(adapter.unavailable.items()):
            lines.append(f"rbcheck unavailable: {cap}: {why}")
    else:
        lines.append("rbcheck unavailable: (none)")
    lines.append(f"rbcheck conventions: {adapter.conventions.describe()}")
    lines.append(f"rbcheck device: {state.device}")
    lines.append(f"rbcheck hypothesis profile: {state.profile}")
    if state.known_failures_path is not None:
        lines.append(
            f"rbcheck known failures: {len(state.known_failures)} ids from {state.known_failures_path.name}"
        )
    elif state.known_failures:
        lines.append(f"rbcheck known failures: {len(state.known_failures)} ids from expected_failures")
    return lines


# --------------------------------------------------------------------------
# Capabilities -> skips
# --------------------------------------------------------------------------


#: Skip reason of exact-replay properties for an adapter declaring seedable=False.
SEED_SKIP = "convention: not seedable (exact replay of draws needs a seed)"


def declared_conventions(item: pytest.Item, adapter: Adapter) -> dict[str, str]:
    """The adapter's deviations from the spec among the conventions ``item``
    declares it checks under (``@pytest.mark.conventions``)."""
    names: set[str] = set()
    for mark in item.iter_markers("conventions"):
        names.update(mark.args)
    deviations = adapter.conventions.deviations(notes=False)
    return {k: v for k, v in deviations.items() if k.split(".", 1)[0] in names}


def capability_skip_reason(adapter: Adapter, capabilities: tuple[str, ...]) -> str | None:
    """The skip reason for a test needing ``capabilities``, or None to run it."""
    for cap in capabilities:
        if cap not in CAPABILITIES:
            raise ValueError(
                f"requires({cap!r}): capability={cap!r}, but should be one of {sorted(CAPABILITIES)}"
            )
    for cap in capabilities:
        if cap in adapter.unavailable:
            return f"unavailable: {cap}: {adapter.unavailable[cap]}"
    for cap in capabilities:
        if cap not in adapter.capabilities:
            return f"not declared: {cap}"
    return None


def spec_capabilities(spec: BufferSpec) -> tuple[str, ...]:
    """Capabilities a :class:`BufferSpec` needs to be built."""
    needed = []
    if spec.sampler in ("random", "prioritized", "slice"):
        needed.append(spec.sampler)
    if spec.priority_key is not None and spec.sampler == "prioritized":
        needed.append("priority_key")
    if spec.transform is not None:
        needed.append("transforms")
    if spec.pin_memory:
        needed.append("pin_memory")
    if str(spec.device).startswith("cuda"):
        needed.append("cuda")
    return tuple(needed)


def _file_of(test_id: str) -> str:
    return test_id.split("::", 1)[0] if "::" in test_id else ""


def _on_disk(root: Path, file_part: str) -> bool:
    return (root / file_part).exists() or any(root.glob(f"tests/**/{file_part}"))


def _usage_error(state: State, message: str) -> pytest.UsageError:
    """A usage error to raise during collection, recorded in the results
    (``errors``) so that every reader of them can say why the run stopped."""
    state.errors.append(f"usage error: {message}")
    return pytest.UsageError(message)


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselection: ids of deselected tests still match
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    state = _state(config)
    for item in items:
        for mark in item.iter_markers("requires"):
            try:
                reason = capability_skip_reason(state.adapter, tuple(mark.args))
            except ValueError as err:
                raise _usage_error(state, f"{item.nodeid}: {err}") from err
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
                break
        if not state.adapter.conventions.seedable and item.get_closest_marker("exact_replay"):
            item.add_marker(pytest.mark.skip(reason=SEED_SKIP))
        for entry in state.known_failures:
            if id_matches(entry.test_id, item.nodeid):
                seed = seed_invariant_of(item.nodeid) if in_suite(item.nodeid) else None
                if seed:
                    raise _usage_error(
                        state,
                        f"known failure id={entry.test_id!r} ({entry.where}) names "
                        f"{suite_relative(item.nodeid)}, a test of seed invariant {seed}, but no entry "
                        f"may hide a seed bug: remove the entry (the failure is reported as FAIL)",
                    )
                entry.matched += 1
                item.stash[_KNOWN_KEY] = entry
                break
    collected_files = {item.nodeid.split("::", 1)[0] for item in items}
    root = Path(str(config.rootpath))
    for entry in state.known_failures:
        if entry.matched:
            continue
        file_part = _file_of(entry.test_id)
        in_run = any(f == file_part or f.endswith("/" + file_part) for f in collected_files)
        if file_part and not in_run and _on_disk(root, file_part):
            continue  # its file is not part of this run: nothing to say
        if not file_part and not any(in_suite(i.nodeid) for i in items):
            continue  # a bare name, and the conformance suite is not being run
        message = (
            f"known failure id={entry.test_id!r} ({entry.where}) "
            f"matches no collected test, but should name one (fixed, renamed or mistyped?)"
        )
        state.warnings.append(message)
        warnings.warn(KnownFailureWarning(message), stacklevel=1)


# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def impl(request: pytest.FixtureRequest) -> Adapter:
    """The Adapter under test (``--impl``)."""
    return _state(request.config).adapter


@pytest.fixture(scope="session")
def reference_impl(request: pytest.FixtureRequest) -> Adapter:
    """The reference Adapter: the model the implementation is compared with."""
    state = _state(request.config)
    if state.adapter.name == "reference":
        return state.adapter
    return load_adapter("reference")


@pytest.fixture
def make_buffer(impl: Adapter):
    """``make_buffer(spec=None, **fields) -> BufferUnderTest`` for the adapter
    under test. A spec needing a capability the adapter lacks (or has
    unavailable) skips the test with the same reasons as ``requires``."""

    def make(spec: BufferSpec | None = None, **fields: Any):
        if spec is None:
            spec = BufferSpec(**fields)
        elif fields:
            spec = spec.but(**fields)
        reason = capability_skip_reason(impl, spec_capabilities(spec))
        if reason:
            pytest.skip(reason)
        return impl.make(spec)

    return make


# --------------------------------------------------------------------------
# Known failures at run time: matched by message
# --------------------------------------------------------------------------

HID_SOMETHING_NEW = "a known failure hid something new"


#: The head of the repro snippet ``assertions.fail`` appends to a message.
_REPRO_IN_MESSAGE = re.compile(r"\n?^Repro \(adapter .*\):$", re.MULTILINE)


def own_message(exc: BaseException) -> str:
    """``str(exc)`` without the repro snippet ``assertions.fail`` attaches
    (``"\\nRepro (adapter ...):\\n    <code>"``): the code that replays a
    failure names calls and classes, not its cause."""
    text = str(exc)
    head = _REPRO_IN_MESSAGE.search(text)
    return text[: head.start()] if head else text


def exception_messages(exc: BaseException) -> list[str]:
    """``"<Type>: <message>"`` of an exception, or of every leaf of an
    exception group (Hypothesis reports several distinct bugs as a group);
    the message without its repro snippet (:func:`own_message`)."""
    subs = getattr(exc, "exceptions", None)  # BaseExceptionGroup (or its 3.10 backport)
    if isinstance(subs, tuple) and subs and all(isinstance(e, BaseException) for e in subs):
        return [m for sub in subs for m in exception_messages(sub)]
    return [f"{type(exc).__name__}: {own_message(exc)}"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    entry = item.stash.get(_KNOWN_KEY, None)
    if entry is None or call.when != "call":
        return
    report = outcome.get_result()
    reason = f"known failure: {entry.reason}"
    if report.passed:
        report.wasxfail = reason  # XPASS: the known failure is gone
        return
    if not report.failed or call.excinfo is None:
        return
    messages = exception_messages(call.excinfo.value)
    if entry.explains(messages):
        report.outcome = "skipped"
        report.wasxfail = reason
        return
    unexplained = next(m for m in messages if not entry.pattern.search(m))
    report.rbcheck_hid_new = (
        f"{HID_SOMETHING_NEW}: entry {entry.test_id!r} expects a message matching "
        f"/{entry.pattern.pattern}/ ({entry.reason}), but this failure is "
        f"{one_line(unexplained, 200)!r}"
    )
    report.sections.append(("rbcheck known failure", report.rbcheck_hid_new))


# --------------------------------------------------------------------------
# Results file
# --------------------------------------------------------------------------

_PREFIX = re.compile(r"^(?:E\s)?[\s|+\-]*")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Failure|Exit)\b.*:")


def one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _plain_lines(text: str) -> list[str]:
    """Report lines without pytest's ``E`` gutter and exception-group bars."""
    return [_PREFIX.sub("", line).rstrip() for line in text.splitlines()]


def _falsifying_example(lines: list[str]) -> str:
    for i, line in enumerate(lines):
        if line.startswith(("Falsifying example:", "Falsifying explicit example:")):
            taken = [line]
            for follow in lines[i + 1 : i + 40]:
                if not follow or follow.startswith(("Explanation:", "You can reproduce", "Traceback")):
                    break
                taken.append(follow)
                if follow == ")":
                    break
            return one_line(" ".join(taken), 300)
    return ""


_REPRO_HEAD = re.compile(r"^Repro \(adapter .*\):$")


def repro_snippets(report: pytest.TestReport) -> list[str]:
    """Every repro snippet a failure printed (``Repro (adapter ...):`` then
    its lines, indented four more, behind the same gutter: pytest's ``E``,
    an exception group's bars), distinct, in order."""
    out: list[str] = []
    raw = (report.longreprtext or "").splitlines()
    for i, line in enumerate(raw):
        col = line.find("Repro (adapter ")
        if col < 0 or not _REPRO_HEAD.match(line[col:].strip()):
            continue
        lead = line[:col]
        body = []
        for follow in raw[i + 1:]:
            if not follow.startswith(lead + "    "):
                break
            body.append(follow[len(lead) + 4:])
        snippet = "\n".join(body)
        if snippet and snippet not in out:
            out.append(snippet)
    return out


def distinct_failures(report: pytest.TestReport) -> list[str]:
    """One line per distinct failure of a test: each explained exception
    (``<Error>: ... but should be ...``) of a Hypothesis exception group, or the
    one failure; in order, without repeats."""
    seen: list[str] = []
    for line in _plain_lines(report.longreprtext or ""):
        if _EXCEPTION_LINE.match(line) and "but should be" in line:
            text = one_line(line)
            if text not in seen:
                seen.append(text)
    return seen or [failure_message(report)]


def failure_message(report: pytest.TestReport) -> str:
    """``<explanation> | <Hypothesis falsifying example>`` on one line; for an
    exception group (Hypothesis found several bugs) the first explained one,
    with the group's summary after it."""
    reprcrash = getattr(report.longrepr, "reprcrash", None)
    crash = reprcrash.message.splitlines()[0] if reprcrash is not None and reprcrash.message else ""
    lines = _plain_lines(report.longreprtext or "")
    if "but should be" not in crash:
        explained = [ln for ln in lines if "but should be" in ln and _EXCEPTION_LINE.match(ln)]
        if explained:
            crash = explained[0] + (f" ({crash})" if crash else "")
        elif not crash:
            errors = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
            crash = errors[-1] if errors else (lines[-1] if lines else "")
    example = _falsifying_example(lines)
    return one_line(crash + (f" | {example}" if example else ""))


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def property_name(item: pytest.Item) -> str:
    module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    name = getattr(item, "originalname", None) or item.name
    return f"{module.removesuffix('.py')}::{name}"


def pytest_sessionstart(session: pytest.Session) -> None:
    state = session.config.stash.get(_STATE_KEY, None)
    if state is not None:
        state.started = time.monotonic()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """``FAILED <test> - <one-line reason>`` for every failed test, never cut
    to the terminal's width (pytest's own summary drops the reason when the
    test id fills an 80-column line, e.g. without a terminal)."""
    state = config.stash.get(_STATE_KEY, None)
    if state is None:
        return
    failed = [r for r in state.records.values() if r["outcome"] in ("fail", "error")]
    if not failed:
        return
    terminalreporter.section("rbcheck: why each test failed")
    for record in failed:
        word = "FAILED" if record["outcome"] == "fail" else "ERROR"
        reasons = record.get("failures") or [record["message"]]
        terminalreporter.line(f"{word} {record['nodeid']} - {reasons[0]}")
        for more in reasons[1:]:
            terminalreporter.line(f"    and: {more}")


def pytest_collection_finish(session: pytest.Session) -> None:
    state = _state(session.config)
    for item in session.items:
        state.records[item.nodeid] = {
            "nodeid": item.nodeid,
            "property": property_name(item),
            "doc": one_line(((getattr(item, "obj", None) and item.obj.__doc__) or "").strip().split("\n\n")[0], 200),
            "outcome": "not run",
            "message": "",
            "conventions": declared_conventions(item, state.adapter),
        }


def pytest_runtest_logfinish(nodeid: str) -> None:
    """``--rbcheck-progress``: once a property's last test is done, one line
    to stderr: ``[rbcheck] <impl> <property>: <outcomes>``."""
    state = _current
    if state is None or not state.progress or nodeid not in state.records:
        return
    name = state.records[nodeid]["property"]
    if not state.pending:
        for record in state.records.values():
            state.pending[record["property"]] = state.pending.get(record["property"], 0) + 1
    state.pending[name] -= 1
    if state.pending[name] == 0:
        counts: dict[str, int] = {}
        for record in state.records.values():
            if record["property"] == name:
                counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
        summary = ", ".join(f"{n} {k}" if n > 1 or len(counts) > 1 else k for k, n in sorted(counts.items()))
        sys.stderr.write(f"[rbcheck] {state.impl_name} {name}: {summary}\n")
        sys.stderr.flush()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    state = _current
    if state is None:
        return
    record = state.records.setdefault(
        report.nodeid,
        {"nodeid": report.nodeid, "property": report.nodeid, "doc": "", "outcome": "not run", "message": ""},
    )
    if record["outcome"] in ("fail", "error") and report.when == "teardown":
        return
    if hasattr(report, "wasxfail"):
        if report.skipped:
            record.update(outcome="xfail", message=one_line(report.wasxfail))
        elif report.passed and report.when == "call":
            record.update(outcome="xpass", message=one_line(report.wasxfail))
        return
    if report.skipped:
        reason = _skip_reason(report)
        outcome = "unavailable" if reason.startswith("unavailable: ") else "skip"
        record.update(outcome=outcome, message=one_line(reason))
    elif report.failed:
        outcome = "fail" if report.when == "call" else "error"
        message = failure_message(report)
        if report.when != "call":
            message = f"in {report.when}: {message}"
        hid = getattr(report, "rbcheck_hid_new", None)
        if hid:
            message = one_line(f"{message} [{hid}]", 600)
            state.hid_new.append(f"{report.nodeid}: {hid}")
        record.update(outcome=outcome, message=message, failures=distinct_failures(report),
                      repros=repro_snippets(report))
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:  # pytest's own FAILED line: the one-line reason, not "ExceptionGroup: ..."
            crash.message = message
    elif report.when == "call" and record["outcome"] == "not run":
        record.update(outcome="pass", message="")
    if report.when == "call" or (report.when == "setup" and report.skipped):
        record["seconds"] = round(record.get("seconds", 0.0) + float(report.duration), 3)


# --------------------------------------------------------------------------
# Errors outside the tests: recorded, so a run that stopped says why
# --------------------------------------------------------------------------


def _last_line(text: str) -> str:
    lines = [line for line in _plain_lines(text) if line.strip()]
    return one_line(lines[-1] if lines else text, 300)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _current is not None and report.failed:
        _current.errors.append(f"collection error in {report.nodeid or '.'}: {_last_line(report.longreprtext)}")


def pytest_internalerror(excrepr, excinfo) -> None:
    if _current is not None:
        what = f"{excinfo.typename}: {excinfo.value}" if excinfo is not None else _last_line(str(excrepr))
        _current.errors.append(f"internal error: {one_line(what, 300)}")


def pytest_keyboard_interrupt(excinfo) -> None:
    if _current is not None:
        message = str(excinfo.value).strip()
        _current.errors.append(f"interrupted: {excinfo.typename}" + (f": {one_line(message, 300)}" if message else ""))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(_STATE_KEY, None)
    if state is None or state.results_path is None:
        return
    adapter = state.adapter
    payload = {
        "schema": RESULTS_SCHEMA,
        "implementation": adapter.name,
        "impl_arg": state.impl_name,
        "version": adapter.version,
        "capabilities": sorted(adapter.capabilities),
        "unavailable": dict(sorted(adapter.unavailable.items())),
        "conventions": adapter.conventions.deviations(),
        "profile": state.profile,
        "known_failures_file": str(state.known_failures_path) if state.known_failures_path else None,
        "warnings": state.warnings,
        "known_failures_hid_new": state.hid_new,
        "exitstatus": int(exitstatus),
        "errors": state.errors,
        "shrink_seconds": state.shrink_seconds,
        "seconds": round(time.monotonic() - state.started, 1) if state.started else None,
        "tests": list(state.records.values()),
    }
    state.results_path.parent.mkdir(parents=True, exist_ok=True)
    state.results_path.write_text(json.dumps(payload, indent=2) + "\n")
