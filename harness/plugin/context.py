"""The run context: which implementation one pytest session tests, how, and
what it has recorded so far. It lives on the session's config (and in the
``rbcheck_run`` fixture), never in a module global, so a pytest run inside
a pytest run (``rbcheck.check_buffer`` from a user's tests) has its own.

:func:`build` reads the options (``--impl``, ``--rbcheck-profile``,
``--rbcheck-device``, ``--rbcheck-results``, ``--rbcheck-known-failures``,
``--rbcheck-shrink-seconds``, ``--rbcheck-progress``, each with its
environment variable; see ``rbcheck.plugin``) and raises
``pytest.UsageError`` naming a bad one. An :class:`InProcessRun` handed to
``pytest.main(..., plugins=[run])`` selects an Adapter object and its
expected failures directly (``rbcheck.check_buffer``).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from rbcheck.harness.adapters import AdapterLoadError, load_adapter
from rbcheck.harness.plugin.known_failures import (
    KnownFailure,
    KnownFailureError,
    parse_known_failures,
)
from rbcheck.harness.plugin.profiles import shrink_budget
from rbcheck.harness.plugin.results import write_load_error
from rbcheck.harness.plugin.skips import on_device
from rbcheck.harness.protocol import Adapter
from rbcheck.plugin import DEFAULT_IMPL, DEFAULT_PROFILE, PROFILES


@dataclass(eq=False)  # a plugin object: hashable by identity
class InProcessRun:
    """An Adapter object (and the expected failures) for one in-process run."""

    adapter: Adapter
    expected: list[KnownFailure] | None = None
    label: str = ""


@dataclass
class RunContext:
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
    settings: dict[str, Any] = field(default_factory=dict)  # what the header and the results show

    def usage_error(self, message: str) -> pytest.UsageError:
        """A usage error to raise during collection, recorded in the results
        (``errors``) so that every reader of them can say why the run stopped."""
        self.errors.append(f"usage error: {message}")
        return pytest.UsageError(message)


def _adapter(config: pytest.Config, in_process: InProcessRun | None) -> tuple[str, Adapter]:
    if in_process is not None:
        return in_process.label or f"check_buffer:{in_process.adapter.name}", in_process.adapter
    impl_name = config.getoption("rbcheck_impl") or os.environ.get("RBCHECK_IMPL") or DEFAULT_IMPL
    try:
        return impl_name, load_adapter(impl_name)
    except Exception as err:
        results = config.getoption("rbcheck_results")
        if results:  # rbcheck validate reads why from here (its own process never loads the adapter)
            write_load_error(Path(results), impl_name, " ".join(f"{type(err).__name__}: {err}".split()))
        if isinstance(err, AdapterLoadError):
            raise pytest.UsageError(str(err)) from err
        raise pytest.UsageError(  # a factory that crashed
            f"impl={impl_name!r}: loading the adapter raised {type(err).__name__}: {err}"
        ) from err


def _setting(config: pytest.Config, option: str, env: str) -> tuple[str | None, str]:
    """A setting's value and where it came from (``--option`` or the
    environment variable), for the header and the results' settings."""
    value = config.getoption(option, default=None)
    if value not in (None, ""):
        return value, "argument"
    value = os.environ.get(env)
    return (value, f"environment variable {env}") if value not in (None, "") else (None, "default")


def _device(config: pytest.Config, adapter: Adapter) -> tuple[str, str]:
    """The device of the buffers under test and where it came from. A device
    other than the CPU that the adapter does not declare ("cuda"), declares
    unavailable, or that this machine does not have, is a usage error: a run
    on it would skip everything and pass."""
    device, source = _setting(config, "rbcheck_device", "RBCHECK_DEVICE")
    device = device or "cpu"
    said = f"rbcheck device={device!r}" + (f" (from the {source})" if source.startswith("env") else "")
    try:
        torch_device = torch.device(device)
    except RuntimeError as err:
        raise pytest.UsageError(f"{said}, but should be a torch device such as 'cpu' or 'cuda' ({err})") from err
    if torch_device.type not in ("cpu", "cuda"):
        raise pytest.UsageError(f"{said}, but should be 'cpu' or 'cuda[:N]'")
    if torch_device.type == "cuda":
        if "cuda" not in adapter.capabilities:
            raise pytest.UsageError(
                f"{said}, but the adapter {adapter.name!r} does not declare 'cuda' (its capabilities: "
                f"{', '.join(sorted(adapter.capabilities)) or 'none'}): run it on 'cpu', or declare 'cuda'")
        if "cuda" in adapter.unavailable:
            raise pytest.UsageError(f"{said}, but the adapter {adapter.name!r} says cuda is unavailable here: "
                                    f"{adapter.unavailable['cuda']}")
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"{said}, but this machine has no CUDA device (torch.cuda.is_available() "
                                    f"is False): run on 'cpu'")
    return device, source


def _known_failures_path(path: str | Path, adapter: Adapter) -> Path:
    """An adapter's ``known_failures`` file. ``--impl pkg.module:factory``
    made it the factory module's already (``load_adapter``); for an Adapter
    object (``check_buffer``) a relative path is the directory's of the
    module defining ``adapter.make``, else the working directory's: the
    first that exists, or the module's."""
    path = Path(path)
    if path.is_absolute():
        return path
    module = sys.modules.get(getattr(adapter.make, "__module__", "") or "")
    where = [Path(module.__file__).resolve().parent] if getattr(module, "__file__", None) else []
    candidates = [base / path for base in [*where, Path.cwd()]]
    return next((c for c in candidates if c.exists()), candidates[0])


def build(config: pytest.Config) -> RunContext:
    """The run context of this session (module doc)."""
    profile, profile_source = _setting(config, "rbcheck_profile", "RBCHECK_PROFILE")
    profile = profile or DEFAULT_PROFILE
    if profile not in PROFILES:
        raise pytest.UsageError(f"rbcheck profile={profile!r}, but should be one of {', '.join(PROFILES)}")
    in_process = next((p for p in config.pluginmanager.get_plugins() if isinstance(p, InProcessRun)), None)
    impl_name, adapter = _adapter(config, in_process)
    device, device_source = _device(config, adapter)
    if device != "cpu":
        adapter = on_device(adapter, device)
    results = config.getoption("rbcheck_results")
    override = config.getoption("rbcheck_known_failures")
    kf_path = Path(override) if override else (
        _known_failures_path(adapter.known_failures, adapter) if adapter.known_failures else None)
    run = RunContext(
        impl_name=impl_name,
        adapter=adapter,
        profile=profile,
        results_path=Path(results) if results else None,
        known_failures_path=Path(kf_path) if kf_path else None,
        device=device,
        progress=bool(config.getoption("rbcheck_progress", default=False)),
    )
    if in_process is not None and in_process.expected is not None:  # fresh counts for this run
        run.known_failures_path = None
        run.known_failures = [replace(entry, matched=0) for entry in in_process.expected]
    elif run.known_failures_path is not None:
        if not run.known_failures_path.exists():
            raise pytest.UsageError(
                f"known failures file={str(run.known_failures_path)!r} does not exist, "
                f"but should be a text file of test ids"
            )
        try:
            run.known_failures = parse_known_failures(run.known_failures_path)
        except KnownFailureError as err:
            raise pytest.UsageError(str(err)) from err
    run.shrink_seconds = shrink_budget(config, impl_name)
    run.settings = settings_of(config, run, profile_source, device_source)
    return run


def settings_of(config: pytest.Config, run: RunContext, profile_source: str, device_source: str) -> dict[str, Any]:
    """Every setting of the run that can change what is tested or how, with
    where each came from: the report's header shows them all."""
    _, shrink_source = _setting(config, "rbcheck_shrink_seconds", "RBCHECK_SHRINK_SECONDS")
    return {
        "profile": run.profile,
        "profile_from": profile_source,
        "device": run.device,
        "device_from": device_source,
        "shrink_seconds": run.shrink_seconds,
        "shrink_seconds_from": shrink_source,
        "known_failures": str(run.known_failures_path) if run.known_failures_path else None,
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith("RBCHECK_")},
    }


def header_lines(run: RunContext) -> list[str]:
    """The header of a run: the implementation, what it declares, and every
    setting that can change what is tested, with where it came from."""
    adapter = run.adapter
    lines = [
        f"rbcheck implementation: {adapter.name} {adapter.version} (--impl {run.impl_name})",
        "rbcheck capabilities: " + (", ".join(sorted(adapter.capabilities)) or "(none)"),
    ]
    for cap, why in sorted(adapter.unavailable.items()):
        lines.append(f"rbcheck unavailable: {cap}: {why}")
    if not adapter.unavailable:
        lines.append("rbcheck unavailable: (none)")
    lines.append(f"rbcheck conventions: {adapter.conventions.describe()}")
    settings = run.settings

    def source(key: str) -> str:
        where = settings.get(f"{key}_from", "")
        return f" (from the {where})" if where.startswith("environment") else ""

    lines.append(f"rbcheck device: {run.device}{source('device')}")
    lines.append(f"rbcheck hypothesis profile: {run.profile}{source('profile')}")
    if settings.get("shrink_seconds_from", "default") != "default":
        lines.append(f"rbcheck shrink seconds: {run.shrink_seconds:g}{source('shrink_seconds')}")
    for key, value in (settings.get("environment") or {}).items():
        lines.append(f"rbcheck environment: {key}={value}")
    if run.known_failures_path is not None:
        lines.append(f"rbcheck known failures: {len(run.known_failures)} ids from {run.known_failures_path.name}")
    elif run.known_failures:
        lines.append(f"rbcheck known failures: {len(run.known_failures)} ids from expected_failures")
    return lines
