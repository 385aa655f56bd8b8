"""Known failures: the one model of an expected failure (a test id, the
pattern of its failure message, a reason), the known-failures file that
declares them, and how an id names a collected test.

A known-failures file holds entries of three lines::

    test_x.py::test_y
        message: <regex searched in the failure message>
        reason: <one line> (<link>)

The id is a property id (``test_x::test_y``, as ``rbcheck list`` prints it), a
node id (``rbcheck/conformance/test_x.py::test_y[p]``) or its tail
(``test_x.py::test_y``, ``test_y``); without ``[...]`` it covers every
parametrization, and each is judged on its own: one that passes is XPASS
even where a sibling still fails (name the failing parametrizations,
``test_x::test_y[p]``, when only some fail). ``message`` is a Python regex
searched (``re.search``) in ``"<ExceptionType>: <message>"`` of the failure,
the repro snippet attached to it left out (every sub-exception of an
exception group must match). A failure whose message matches is reported as
``xfail`` with the reason; a pass is ``XPASS`` (update the file); a failure
with any other message stays a failure, and its message says that a known
failure hid something new. An id that matches no collected test warns. A
pattern that would match failures it was not written for (one that finds any
of :data:`UNRELATED_FAILURES`, such as ``.`` or ``^AssertionError: ``) is
refused, with how to write a specific one.

No entry may hide a seed bug (docs/design.md, "The seed invariants"): an
entry naming a test of a seed invariant (``rbcheck.harness.invariants``) is
refused; those failures always show as FAIL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rbcheck.harness import invariants

KNOWN_FAILURE_KEYS = ("message", "reason")
#: Failures that no entry is written for: one of each kind a buffer or the
#: suite can raise. A pattern that finds any of them is a catch-all (".",
#: "(?s).", "Error", "^AssertionError: ", "but should be") and is refused.
UNRELATED_FAILURES = (
    "AssertionError: len(buffer)=3, but should be 4 [extend(2)(BufferSpec(capacity=4))]",
    "AssertionError: assert 1 == 2",
    "AssertionError: ",
    "TypeError: 'NoneType' object is not subscriptable",
    "RuntimeError: The size of tensor a (3) must match the size of tensor b (4) at non-singleton dimension 0",
    "IndexError: index 7 is out of bounds for dimension 0 with size 4",
    "ValueError: could not convert string to float: 'abc'",
    "KeyError: 'obs'",
    "ZeroDivisionError: division by zero",
    "AttributeError: 'Buffer' object has no attribute 'sampler'",
    "OSError: [Errno 28] No space left on device",
    "RecursionError: maximum recursion depth exceeded",
    "MemoryError: ",
    "Failed: DID NOT RAISE <class 'ValueError'>",
    "_",
    "0",
    "QZJX",
    " ",
)
HID_SOMETHING_NEW = "a known failure hid something new"

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
    hidden = next((m for m in UNRELATED_FAILURES if pattern.search(m)), None)
    if hidden is not None:
        raise KnownFailureError(
            f"{label}: message={message!r} would also hide unrelated failures, such as {hidden!r}, but should "
            f"match only the failure it was written for: copy the part of that failure's message that names "
            f"its cause, with the regex specials escaped (re.escape), e.g. "
            f"'load \\(capacity_differs\\)=<returned normally>'"
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
    """The seed invariant a test checks (``"<seed> (<invariant id>)"``), or
    None; read from the catalogue of invariants."""
    rel = suite_relative(nodeid)
    if rel == nodeid and "/" in nodeid.split("::", 1)[0]:
        return None  # not a test of the conformance suite
    file_part, sep, rest = rel.partition("::")
    inv = invariants.seed_invariant_of(f"{file_part.removesuffix('.py')}{sep}{rest}")
    return f"{inv.seed} ({inv.id})" if inv is not None else None

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


def known_failure_of(entries: list[KnownFailure], nodeid: str) -> KnownFailure | None:
    """The entry that covers ``nodeid`` (counted in its ``matched``), or None.
    An entry naming a test of a seed invariant is a :class:`KnownFailureError`:
    no entry may hide a seed bug."""
    for entry in entries:
        if id_matches(entry.test_id, nodeid):
            seed = seed_invariant_of(nodeid) if in_suite(nodeid) else None
            if seed:
                raise KnownFailureError(
                    f"known failure id={entry.test_id!r} ({entry.where}) names "
                    f"{suite_relative(nodeid)}, a test of seed invariant {seed}, but no entry "
                    f"may hide a seed bug: remove the entry (the failure is reported as FAIL)"
                )
            entry.matched += 1
            return entry
    return None


def unmatched_entries(entries: list[KnownFailure], items: list, root: Path) -> list[str]:
    """What to say of each entry that matched no collected test (fixed,
    renamed or mistyped), unless its file is not part of this run or it is a
    bare name and the suite is not being run."""
    collected_files = {item.nodeid.split("::", 1)[0] for item in items}
    said = []
    for entry in entries:
        if entry.matched:
            continue
        file_part = entry.test_id.split("::", 1)[0] if "::" in entry.test_id else ""
        in_run = any(f == file_part or f.endswith("/" + file_part) for f in collected_files)
        on_disk = bool(file_part) and ((root / file_part).exists() or any(root.glob(f"tests/**/{file_part}")))
        if file_part and not in_run and on_disk:
            continue  # its file is not part of this run: nothing to say
        if not file_part and not any(in_suite(i.nodeid) for i in items):
            continue  # a bare name, and the conformance suite is not being run
        said.append(f"known failure id={entry.test_id!r} ({entry.where}) "
                    f"matches no collected test, but should name one (fixed, renamed or mistyped?)")
    return said
