"""The shape of the installed package (issue 18): no file over 500 lines, no
import cycle between its modules, and no import of a name that exists only in
the repository. Static (``ast`` over the sources, nothing imported): well
under a second.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The installed package: its name -> the repository folder it is built from
#: (pyproject.toml, [tool.setuptools] package-dir).
PACKAGE = {"rbcheck": "rbcheck", "rbcheck.reference": "reference",
           "rbcheck.variants": "variants", "rbcheck.harness": "harness"}
MAX_LINES = 500
#: Files allowed over the limit while another change splits or moves them
#: (none now: keep it empty, and drop an entry once its file fits or is gone).
TOO_LONG_FOR_NOW: frozenset[str] = frozenset()
#: Files whose one concept is longer than MAX_LINES, with why (docs/design.md,
#: "Style"): each may grow to LONG_CONCEPT_LINES; split by concept, never by count.
LONG_CONCEPTS: dict[str, str] = {
    "harness/protocol.py": "the adapter contract: BufferSpec, Conventions and Adapter are read together, "
                           "each field beside the capability it belongs to",
    "harness/invariants.py": "the catalogue of invariants: one table, read as one",
}
LONG_CONCEPT_LINES = 800
#: Top-level names that import only in a clone of the repository: the
#: folders the package is built from (installed as rbcheck.*) and the
#: repository-only packages (not in the wheel).
REPOSITORY_ONLY = ("reference", "variants", "harness", "tests", "bench", "tools")


def package_files() -> list[Path]:
    """Every file the wheel installs from the package's folders (sources,
    the C source, known-failure lists), caches and build outputs left out."""
    files = []
    for folder in PACKAGE.values():
        for path in sorted((REPO / folder).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".so"):
                continue
            files.append(path)
    return files


def module_names() -> dict[str, Path]:
    """The package's modules by their installed name."""
    names = {}
    for package, folder in PACKAGE.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if package == "rbcheck" and parts[0] in PACKAGE.values():
                continue  # not part of rbcheck/ (never the case; kept for safety)
            if parts[-1] == "__init__":
                parts.pop()
            names[".".join([package, *parts])] = path
    return names


def imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """``(imported name, line)`` for every import in the module, at any
    depth (function-level imports included); ``from a import b`` imports
    ``a.b`` when that is one of ``modules``, else ``a``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in modules else target, node.lineno))
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    modules = module_names()
    return {name: {target for target, _ in imports(name, path, modules) if target in modules} - {name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan),
    and modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_installed_file_is_over_500_lines():
    """Every file of the installed package has at most MAX_LINES lines,
    but the ones listed in TOO_LONG_FOR_NOW, and a file of LONG_CONCEPTS at
    most LONG_CONCEPT_LINES (each listed file exists)."""
    lines = {str(p.relative_to(REPO)): len(p.read_bytes().splitlines()) for p in package_files()}
    assert set(LONG_CONCEPTS) <= set(lines), f"LONG_CONCEPTS={sorted(set(LONG_CONCEPTS) - set(lines))} are gone"
    limit = {path: LONG_CONCEPT_LINES if path in LONG_CONCEPTS else MAX_LINES for path in lines}
    long = sorted(f"{path} ({n} lines)" for path, n in lines.items()
                  if n > limit[path] and path not in TOO_LONG_FOR_NOW)
    assert not long, f"files over {MAX_LINES} lines={long}, but should be none: split them by concept"


def test_the_package_has_no_import_cycle():
    """No module of the package imports (at any depth, lazily included) a
    module that imports it back, directly or through others: a lazy import
    hides a cycle until the day the import moves to the top."""
    found = cycles(import_graph())
    assert not found, f"import cycles={found}, but should be none: move the shared piece into a third module"


def test_the_cycle_finder_finds_a_cycle():
    """The control: a two-module and a three-module cycle are found, a chain is not."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_package_imports_nothing_that_exists_only_in_the_repository():
    """The installed package never imports a repository folder by its bare
    name (``import harness``: a second copy in a clone, an ImportError
    installed) nor a repository-only package (``tests``, ``bench``): ruff's
    banned-api rule catches the first everywhere; this catches both in the
    package, function-level imports included."""
    bad = []
    modules = module_names()
    for name, path in modules.items():
        for target, line in imports(name, path, modules):
            if target.split(".")[0] in REPOSITORY_ONLY:
                bad.append(f"{path.relative_to(REPO)}:{line}: {target}")
    assert not bad, f"imports of repository-only names={sorted(set(bad))}, but should be rbcheck.* or none"


def test_no_file_cites_a_design_document_outside_the_repository():
    """The design is docs/design.md: no source, test or doc cites a design
    document that is not in the repository."""
    outside = ("DESIGN" + ".md", "REAL_BUGS" + ".md", "../" + "shared")
    roots = [*(REPO / f for f in PACKAGE.values()), REPO / "tests", REPO / "bench", REPO / "docs"]
    files = [REPO / "README.md", REPO / "noxfile.py", REPO / "pyproject.toml"]
    files += [p for root in roots for p in root.rglob("*")
              if p.suffix in (".py", ".md", ".txt", ".c", ".toml") and "__pycache__" not in p.parts]
    cited = sorted(f"{p.relative_to(REPO)}: {name}" for p in files if p.is_file()
                   for name in outside if name in p.read_text(errors="replace"))
    assert not cited, f"citations of documents outside the repository={cited}, but should be docs/design.md"


def test_the_readme_is_short():
    """The README is for users (at most 300 lines); measurements live in docs/results/."""
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= 300, f"README.md lines={lines}, but should be <= 300: move details into docs/"


def test_the_readme_names_every_builtin():
    """The README's list of built-in names follows the one table (BUILTIN)."""
    from rbcheck.harness.adapters import BUILTIN

    text = (REPO / "README.md").read_text()
    missing = [name for name in BUILTIN if f"`{name}`" not in text]
    assert not missing, f"built-in names missing from README.md={missing}, but should be none"


#: The conformance files not yet moved to recorded repros (issue 45 item 3):
#: their hand-written buffer calls are tolerated until each is converted.
#: Keep shrinking it; drop an entry once its file passes the check below.
HAND_WRITTEN_REPROS_FOR_NOW: frozenset[str] = frozenset({
})
#: Names the conformance files give buffers (``buf``, ``buf2``, ``twin``, ...):
#: a call on one of them in a repro line is the recorder's to write.
BUFFER_CALL = r"\b(?:buf\w*|buffer\w*|twin\w*|fresh|old|loaded|src|source|target)\s*\.\s*\w+\s*\("


def hand_written_buffer_calls(path: Path) -> list[str]:
    """``"<file>:<line>: <text>"`` of each ``<x>trace.op(<text>)`` in ``path``
    whose text calls a buffer or makes one by hand. The text is the call's
    first argument, a string or an f-string (its ``{...}`` read as ``{}``);
    it is one if, outside a comment (after ``#``), it matches
    :data:`BUFFER_CALL` or names ``load_adapter(``; a text that starts with a
    ``{...}`` (its start unknown) or that is no string at all counts too.
    Comments (``trace.note``) and setup that calls no buffer (``trace.op("os.truncate(...)")``)
    are fine; calls on a buffer are recorded by ``trace.wrap``/``trace.make``."""
    import re

    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        if not (isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == "op"):
            continue
        owner = func.value
        owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
        if not owner_name.endswith("trace") or not node.args:
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            text, unknown_start = arg.value, False
        elif isinstance(arg, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in arg.values)
            unknown_start = not arg.values or not isinstance(arg.values[0], ast.Constant)
        else:
            text, unknown_start = "", True
        code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        if unknown_start or re.search(BUFFER_CALL, code) or "load_adapter(" in code:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(arg)[:100]}")
    return found


def test_conformance_records_its_buffer_calls_instead_of_writing_them():
    """No property writes a repro line for a call on a buffer by hand: its
    buffers are recording proxies (``buf = trace.wrap(impl.make(spec))``,
    ``trace.make(spec, "twin")``) that write each call with its arguments as
    it is made, so the snippet is what ran."""
    conformance = REPO / "rbcheck" / "conformance"
    found = [hit for path in sorted(conformance.glob("test_*.py"))
             if path.name not in HAND_WRITTEN_REPROS_FOR_NOW for hit in hand_written_buffer_calls(path)]
    assert not found, f"hand-written repro lines for buffer calls={found}, but should be none: record them"


def test_the_repro_line_check_finds_hand_written_buffer_calls(tmp_path):
    probe = REPO / "rbcheck" / "conformance" / "_probe_for_test_codebase.py"
    text = ('trace.op(f"buf.extend(layout.batch({n}, 3))")\n'
            'self.trace.op("rows, info = twin.sample(4)")\n'
            'trace.op(f"{var}.sample(2)")\n'
            'trace.op(call)\n'
            'trace.op(f"x = load_adapter({a!r}).make(spec)")\n'
            'trace.op("# buf.sample(4) in a comment")\n'
            'trace.op(f"os.truncate({p!r}, 3)")\n')
    probe.write_text(text)
    try:
        hits = hand_written_buffer_calls(probe)
    finally:
        probe.unlink()
    assert [int(h.split(":")[1]) for h in hits] == [1, 2, 3, 4, 5], hits
