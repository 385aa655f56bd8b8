"""One implementation's run and the text of one cell of the report: the
pieces the report (``rbcheck.harness.report``), the verdict
(``rbcheck.harness.verdict``) and the runners (``rbcheck.runner``,
``rbcheck.checks``) share, in a module that imports none of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["NOT_RUN", "PART_SCHEMA", "ImplResult", "TRIED", "cell_text", "conventions_text"]

#: Outcomes of a test that ran (a cell of one of them states the conventions it ran under).
TRIED = ("pass", "fail", "error", "xfail", "xpass")
#: The schema of a part (one implementation's ImplResult as JSON, ``--parts``).
PART_SCHEMA = 1
#: The status of an implementation asked for whose part is missing from a merge.
NOT_RUN = "not run"


@dataclass
class ImplResult:
    """One implementation's run: either loaded and run, or why not."""

    name: str
    status: str  # "ran" | "unavailable" | "crashed" | "not run" (no part in a merge)
    why: str = ""
    version: str = ""
    capabilities: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    conventions: dict[str, str] = field(default_factory=dict)
    exitstatus: int | None = None
    warnings: list[str] = field(default_factory=list)
    tests: list[dict[str, Any]] = field(default_factory=list)
    seconds: float | None = None  # the run's wall time
    shrink_seconds: float | None = None  # shrinking budget per failing property (None: Hypothesis')
    errors: list[str] = field(default_factory=list)  # errors outside the tests (usage, collection, ...)
    output: str = ""  # pytest's own output (stderr, then stdout's tail), shown when the run did not complete
    settings: dict[str, Any] = field(default_factory=dict)  # profile, device, ... and where each came from

    def to_part(self) -> dict[str, Any]:
        """This result as plain JSON data (a part of a merged report:
        ``report.write_part``), every field kept."""
        return {"schema": PART_SCHEMA, **asdict(self)}

    @classmethod
    def from_part(cls, payload: dict[str, Any]) -> ImplResult:
        """The inverse of :meth:`to_part`; a payload of another schema or
        without a name and status is refused with a ValueError."""
        if not isinstance(payload, dict) or payload.get("schema") != PART_SCHEMA:
            got = payload.get("schema") if isinstance(payload, dict) else type(payload).__name__
            raise ValueError(f"part schema={got!r}, but should be {PART_SCHEMA} (written by rbcheck validate --parts)")
        known = {f.name for f in fields(cls)}
        if not isinstance(payload.get("name"), str) or payload.get("status") not in ("ran", "unavailable", "crashed"):
            raise ValueError(f"part name={payload.get('name')!r}, status={payload.get('status')!r}, but should be "
                             f"a name and one of 'ran', 'unavailable', 'crashed'")
        return cls(**{k: v for k, v in payload.items() if k in known})

    @classmethod
    def from_results(cls, name: str, payload: dict[str, Any]) -> ImplResult:
        return cls(
            name=name,
            status="ran",
            version=payload.get("version", ""),
            capabilities=list(payload.get("capabilities", [])),
            unavailable=dict(payload.get("unavailable", {})),
            conventions=dict(payload.get("conventions", {})),
            exitstatus=payload.get("exitstatus"),
            warnings=list(payload.get("warnings", [])),
            tests=list(payload.get("tests", [])),
            seconds=payload.get("seconds"),
            shrink_seconds=payload.get("shrink_seconds"),
            errors=list(payload.get("errors", [])),
            settings=dict(payload.get("settings") or {}),
        )


def conventions_text(conventions: dict[str, str]) -> str:
    """`` [convention: weight_normaliser=batch_max; ...]`` or ``""``."""
    if not conventions:
        return ""
    return " [convention: " + "; ".join(f"{k}={v}" for k, v in sorted(conventions.items())) + "]"


def cell_text(outcome: str, message: str, conventions: dict[str, str] | None = None) -> str:
    """The cell of one result; the deviations it was checked under follow it."""
    text = _cell_text(outcome, message)
    if outcome in TRIED and conventions:  # before the message, so clipping keeps it
        head, _, rest = text.partition(" ")
        text = head + conventions_text(conventions) + (" " + rest if rest else "")
    return text


def _cell_text(outcome: str, message: str) -> str:
    if outcome == "pass":
        return "pass"
    if outcome in ("fail", "error"):
        return f"FAIL ({message})" if message else "FAIL"
    if outcome == "unavailable":
        why = message[len("unavailable: "):] if message.startswith("unavailable: ") else message
        return f"unavailable ({why})"
    if outcome == "skip":
        return f"skipped ({message})"
    if outcome == "xfail":
        reason = message[len("known failure: "):] if message.startswith("known failure: ") else message
        return f"known failure ({reason})"
    if outcome == "xpass":
        return f"XPASS ({message})"
    return outcome
