"""The package's import layers: no module imports one of a higher layer, and
no modules import each other in a loop.

:data:`LAYERS` places every subpackage and top-level module of
``queueserver/`` in one layer, lowest first. A module may import modules of
its own unit (subpackage or top-level module) and of units in *lower*
layers only; units of one layer are peers that import nothing of each
other. The order follows what each needs to do its job, never who runs it:

* the leaves import nothing of the package: the build record, small file,
  host and process helpers, :mod:`queueserver.placement` (which shard and
  which slot a queue lives in: the one rule that the engine, routers,
  shards and the cluster share), the job number blocks, the Python client
  and the history pipeline; then the package's own ``__init__`` (which
  build runs: it reads the build record);
* the **engine** is the pure state machine of one shard: it may know only
  where a queue lives (slot arithmetic), never a file, socket or codec;
* the **protocols** turn bytes into the engine's requests and its replies
  into bytes, so they sit on the engine's types;
* **metrics** are the counters the hot path bumps (traffic, histograms,
  which protocols used a queue) and the control socket that reads them:
  below everything that counts;
* **access** (the access file: identities and what each may do) reads the
  verbs the table of operations declares and the codecs' commands; a peer
  of metrics;
* **net** (client connections, frame channels, link authentication) runs
  the codecs and counts into metrics; the **store** (the shards' logs)
  counts its fsyncs there; neither knows the other;
* the **cluster** (its file, etcd, slot moves), the server's **config** and
  **reshard** (a data directory rewritten for a new shard count) build on
  those;
* **links** is what routers and shards share to reach a shard: the shard
  links, the slot map, where primaries serve, the job directory, the client
  descriptions that travel over links;
* **shard** and **router** are the worker processes' shells; they share
  only what lies below (links), never each other;
* the **console** (and the node's HTTP port), the data directory's layout
  and the binding of the listeners are the supervisor's parts, which read
  shards' outcomes (a history line) but run in the supervisor;
* the **runtime directory** (where the processes' sockets meet) words an
  OS error as the binding of the listeners does (with its ``reason``), so
  it sits above them;
* the **supervisor** starts and watches the processes; the command line,
  the Spark data source and the test tooling are entry points above it all.

What is counted as an import: ``import`` and ``from ... import`` statements
anywhere in a module (at its top, in a function, under ``try``), resolved
to the module they load. Imports under ``if TYPE_CHECKING:`` count for the
layers (a type from a higher layer is a dependency on it just the same) but
not for loops: they never run, and types that refer to each other (a
timer's entries are jobs, a job is a timer entry) can only be written so.
``importlib.import_module`` with a computed name (the codec table in
:mod:`queueserver.protocols`) is not seen.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Sequence, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "queueserver"

#: Every unit of ``queueserver/``, lowest layer first (see the module's
#: docstring for why): a subpackage by its name, a top-level module by its
#: name, the package's own ``__init__.py`` as ``__init__``.
LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("buildrecord", "privatefile", "hostsize", "lifecycle", "memwatch", "dirlock", "placement",
     "jobnumbers", "client", "history"),
    ("__init__",),
    ("engine",),
    ("protocols",),
    ("metrics", "access"),
    ("net", "store"),
    ("cluster", "config", "reshard"),
    ("links",),
    ("shard", "router"),
    ("console", "datadir", "listening"),
    ("runtimedir",),
    ("supervisor",),
    ("cli", "spark", "testing"),
    ("__main__",),
)


class Import(NamedTuple):
    source: str       # the importing module, dotted
    target: str       # the module imported, dotted
    path: str         # the importing file, relative to the package's parent
    line: int
    type_only: bool   # under ``if TYPE_CHECKING:``


def modules(package: Path) -> Dict[str, Path]:
    """Every module of ``package`` by its dotted name (a subpackage by its own)."""
    found: Dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _targets(module: str, is_package: bool, node: ast.AST, known: Dict[str, Path]) -> List[str]:
    """The modules of the package that one import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            base = module if is_package else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        # ``from a import b`` loads the module a.b if there is one, else names a's attribute
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = []
    for name in names:
        while name and name not in known:   # ``import a.b.c`` of a non-module c: its package
            name = name.rpartition(".")[0]
        if name and name != module and name not in found:
            found.append(name)
    return found


def imports(package: Path) -> List[Import]:
    """Every import inside ``package`` of a module of ``package``."""
    known = modules(package)
    found: List[Import] = []
    for module, path in known.items():
        rel = str(path.relative_to(package.parent))
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, type_only: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for inner in child.body:
                        visit_one(inner, True)
                    for inner in child.orelse:
                        visit_one(inner, type_only)
                else:
                    visit_one(child, type_only)

        def visit_one(node: ast.AST, type_only: bool) -> None:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, is_package, node, known):
                    found.append(Import(module, target, rel, node.lineno, type_only))
            visit(node, type_only)

        visit(ast.parse(path.read_text(), rel), False)
    return found


def unit(module: str) -> str:
    """A module's unit: ``queueserver.shard.direct`` -> ``shard``, ``queueserver`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def misplaced(package: Path, layers: Sequence[Sequence[str]]) -> List[str]:
    """Units that the table leaves out, names twice, or names but do not exist."""
    table = [name for layer in layers for name in layer]
    present = {unit(module) for module in modules(package)}
    problems = [f"{name}: named {table.count(name)} times in LAYERS" for name in sorted(set(table))
                if table.count(name) > 1]
    problems += [f"{name}: not in LAYERS (place it in the layer of what it imports and is imported by)"
                 for name in sorted(present - set(table))]
    problems += [f"{name}: in LAYERS but not in the package" for name in sorted(set(table) - present)]
    return problems


def upward(found: Iterable[Import], layers: Sequence[Sequence[str]]) -> List[str]:
    """Imports of a unit of the same or a higher layer."""
    level = {name: i for i, layer in enumerate(layers) for name in layer}
    problems = []
    for imp in found:
        source, target = unit(imp.source), unit(imp.target)
        if source == target or source not in level or target not in level:
            continue
        if level[target] >= level[source]:
            how = " (under TYPE_CHECKING)" if imp.type_only else ""
            problems.append(f"{imp.path}:{imp.line} imports {imp.target}{how}: {source} (layer "
                            f"{level[source]}) may not import {target} (layer {level[target]})")
    return problems


def loops(found: Iterable[Import]) -> List[str]:
    """Each set of modules that import each other in a loop (imports that run,
    not those under TYPE_CHECKING), with the imports that close it."""
    edges: Dict[str, Dict[str, Import]] = {}
    for imp in found:
        if not imp.type_only:
            edges.setdefault(imp.source, {}).setdefault(imp.target, imp)
    # Tarjan's strongly connected components, iteratively (no recursion limit)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges.get(target, {})))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    problems = []
    for component in components:
        members = set(component)
        closing = [f"{imp.path}:{imp.line} imports {imp.target}" for source in component
                   for target, imp in sorted(edges.get(source, {}).items()) if target in members]
        problems.append(f"{len(component)} modules in a loop: " + "; ".join(closing))
    return problems


def _report(problems: List[str]) -> str:
    return f"{len(problems)} found:\n" + "\n".join(problems)


def test_every_unit_has_one_layer() -> None:
    problems = misplaced(PACKAGE, LAYERS)
    assert not problems, _report(problems)


def test_no_import_runs_up_the_layers() -> None:
    problems = upward(imports(PACKAGE), LAYERS)
    assert not problems, _report(problems)


def test_no_modules_import_each_other_in_a_loop() -> None:
    problems = loops(imports(PACKAGE))
    assert not problems, _report(problems)


# ------------------------------------------------ the checks themselves
def _package(root: Path, files: Dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "queueserver"


SAMPLE = {
    "queueserver/__init__.py": "",
    "queueserver/low/__init__.py": "from .a import A\n",
    "queueserver/low/a.py": "A = 1\n",
    "queueserver/low/b.py": "from . import a\nfrom .. import helper\n",
    "queueserver/helper.py": "import os\n",
    "queueserver/high/__init__.py": "",
    "queueserver/high/c.py": "from ..low.a import A\nfrom queueserver.low import b\n",
}
SAMPLE_LAYERS = (("helper",), ("__init__",), ("low",), ("high",))


def test_the_checks_pass_a_sound_package(tmp_path: Path) -> None:
    package = _package(tmp_path, SAMPLE)
    found = imports(package)
    assert {(imp.source, imp.target) for imp in found} == {
        ("queueserver.low", "queueserver.low.a"), ("queueserver.low.b", "queueserver.low.a"),
        ("queueserver.low.b", "queueserver.helper"), ("queueserver.high.c", "queueserver.low.a"),
        ("queueserver.high.c", "queueserver.low.b")}
    assert misplaced(package, SAMPLE_LAYERS) == []
    assert upward(found, SAMPLE_LAYERS) == []
    assert loops(found) == []


@pytest.mark.parametrize("where", ["at the top", "in a function", "under try", "under TYPE_CHECKING"])
def test_an_upward_import_is_found_wherever_it_is(tmp_path: Path, where: str) -> None:
    line = "from ..high import c"
    text = {"at the top": f"{line}\n",
            "in a function": f"def f() -> None:\n    {line}\n",
            "under try": f"try:\n    {line}\nexcept ImportError:\n    pass\n",
            "under TYPE_CHECKING": f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    {line}\n"}[where]
    package = _package(tmp_path, {**SAMPLE, "queueserver/low/d.py": text})
    problems = upward(imports(package), SAMPLE_LAYERS)
    assert len(problems) == 1 and problems[0].startswith("queueserver/low/d.py:")
    assert "low (layer 2) may not import high (layer 3)" in problems[0]


def test_peers_of_one_layer_may_not_import_each_other(tmp_path: Path) -> None:
    package = _package(tmp_path, {**SAMPLE, "queueserver/side.py": "from .high import c\n"})
    layers = (("helper",), ("__init__",), ("low",), ("high", "side"))
    assert misplaced(package, layers) == []
    assert upward(imports(package), layers) == ["queueserver/side.py:1 imports queueserver.high.c: side "
                                                "(layer 3) may not import high (layer 3)"]


def test_a_loop_is_found_and_a_type_only_one_is_not(tmp_path: Path) -> None:
    looped = {**SAMPLE, "queueserver/low/a.py": "A = 1\n\ndef f() -> None:\n    from . import b\n"}
    problems = loops(imports(_package(tmp_path / "runs", looped)))
    assert problems == ["2 modules in a loop: queueserver/low/a.py:4 imports queueserver.low.b; "
                        "queueserver/low/b.py:1 imports queueserver.low.a"]
    typed = {**SAMPLE, "queueserver/low/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    from .b import helper\nA = 1\n"}
    assert loops(imports(_package(tmp_path / "typed", typed))) == []


def test_a_unit_outside_the_table_or_twice_in_it_is_found(tmp_path: Path) -> None:
    package = _package(tmp_path, {**SAMPLE, "queueserver/stray.py": ""})
    assert misplaced(package, SAMPLE_LAYERS + (("low", "gone"),)) == [
        "low: named 2 times in LAYERS",
        "stray: not in LAYERS (place it in the layer of what it imports and is imported by)",
        "gone: in LAYERS but not in the package"]
