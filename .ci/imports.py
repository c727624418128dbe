"""Import layering and cycles, for the Python package and the Rust core.

Python (``python/tokpack``): it fails on an import of a unit (a subpackage or top-level module)
that does not stand strictly below the importer in ``LAYERS`` (an upward import, or a sideways
one between two units of one layer; so no two folders import each other), counting every
``import`` (top level, inside functions and under ``TYPE_CHECKING`` alike: a lazy import is
still a dependency), and on a cycle of the modules' imports that run when they are loaded. The
cycles only imports inside functions close (a deferred ``from .check import ...``) are listed
and counted, not failed.

Rust (``rust/tokpack-core/src``, outside ``#[cfg(test)]`` items): the ``crate::`` / ``super::`` /
``self::`` paths of ``use`` lines and of the code, each resolved to the deepest module it names
(through ``pub use`` re-exports), make the module graph; it fails on a cycle. A parent's
``mod`` and ``pub use`` lines are the tree, not dependencies.

Prints the counts (upward imports, Python cycles, Rust cycles), then each offence.
``python .ci/imports.py`` exits 1 on any; ``--python`` / ``--rust`` check one language.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "python" / "tokpack"
CORE = ROOT / "rust" / "tokpack-core" / "src"

# The Python package's units, bottom first: a unit imports only units of lower layers. The
# ground floor holds what every area checks against (errors, the core's names and the compiled
# module, the shared checkers); `_io` is every command's edges; the packed directory's format
# and reader sit below everything that reads or writes it (object storage, the pack job, the
# loaders); the entry points (torch, tree, ray, the CLI) and the lazy facade are on top.
LAYERS: list[list[str]] = [
    ["_tokpack", "errors"],
    ["_contract", "_checks"],
    ["_io"],
    ["kinds"],
    ["packed"],
    ["remote"],
    ["tokenize"],
    ["multimodal"],
    ["pack"],
    ["balance", "synthetic"],
    ["compat", "stats"],
    ["torch"],
    ["tree", "ray"],
    ["commands"],
    ["cli"],
    ["__main__", "tokpack"],
]


def python_modules() -> dict[str, Path]:
    """Module name -> file, for every ``.py`` (and the compiled module's ``.pyi``)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.rglob("*.pyi")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules.setdefault(".".join(parts), path)
    return modules


def at_import(tree: ast.Module) -> set[ast.AST]:
    """The import statements a module runs when it is loaded: not inside a function, nor under
    ``if TYPE_CHECKING:``."""
    found: set[ast.AST] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(ast.Module(body=child.orelse, type_ignores=[]))
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.add(child)
            visit(child)

    visit(tree)
    return found


def python_edges(modules: dict[str, Path], loaded_only: bool) -> dict[str, dict[str, int]]:
    """Importer -> {imported module: line of its first import}: every import, or (``loaded_only``)
    those that run when the importer is loaded."""
    edges: dict[str, dict[str, int]] = defaultdict(dict)
    for name, path in modules.items():
        if path.suffix != ".py":
            continue
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        loaded = at_import(tree) if loaded_only else None
        for node in ast.walk(tree):
            if loaded is not None and node not in loaded:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".")
                    keep = len(base) - node.level + (1 if is_package else 0)
                    base = base[:keep]
                    if node.module:
                        base += node.module.split(".")
                    source = ".".join(base)
                else:
                    source = node.module or ""
                # `from pkg import sub` imports the submodule `pkg.sub`.
                targets = [
                    f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                    for a in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target.startswith("tokpack") and target != name:
                    edges[name].setdefault(target, node.lineno)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
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

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def one_circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest circle through the component's first node, to show (a -> b -> ... -> a)."""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph.get(node, ())):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if succ in members and succ not in previous:
                    previous[succ] = node
                    following.append(succ)
        frontier = following
    return component


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tokpack"


def check_python() -> int:
    modules = python_modules()
    edges = python_edges(modules, loaded_only=False)
    loaded = python_edges(modules, loaded_only=True)
    layer = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    units = {unit_of(m) for m in modules}
    problems = [f"unit {u!r} is in no layer of .ci/imports.py" for u in sorted(units - set(layer))]
    upward = []
    for importer, imported in sorted(edges.items()):
        for target, line in sorted(imported.items()):
            a, b = unit_of(importer), unit_of(target)
            if a != b and a in layer and b in layer and layer[b] >= layer[a]:
                where = modules[importer].relative_to(ROOT)
                way = "sideways" if layer[a] == layer[b] else "upward"
                upward.append(f"{where}:{line}: {importer} imports {target} ({way}: {a} -> {b})")
    graph = {m: set(t) for m, t in loaded.items()}
    found = cycles(graph)
    every = {m: set(t) for m, t in edges.items()}
    deferred = [c for c in cycles(every) if not any(set(c) >= set(f) for f in found)]
    print(f"python: {len(modules)} modules, {sum(map(len, edges.values()))} imports")
    print(f"python: upward imports: {len(upward)}")
    print(f"python: import cycles: {len(found)}")
    print(f"python: deferred import cycles (through imports inside functions): {len(deferred)}")
    for problem in problems + upward:
        print(f"  {problem}")
    for component in found:
        print(f"  cycle ({len(component)} modules): {' -> '.join(one_circle(graph, component))}")
    for component in deferred:
        circle = " -> ".join(one_circle(every, component))
        print(f"  deferred cycle, not failing ({len(component)} modules): {circle}")
    return len(problems) + len(upward) + len(found)


# --- Rust ---------------------------------------------------------------------------------

TOKEN = re.compile(
    r"""
      (?P<comment>//[^\n]*|/\*.*?\*/)
    | (?P<raw>b?r(?P<hashes>\#*)".*?"(?P=hashes))
    | (?P<string>b?"(?:\\.|[^"\\])*")
    | (?P<char>b?'(?:\\.|[^'\\])')
    """,
    re.S | re.X,
)


def strip_rust(text: str) -> str:
    """The source without comments, strings and chars (their line breaks kept)."""

    def blank(match: re.Match[str]) -> str:
        return "\n" * match.group(0).count("\n") if match.group("comment") else '""'

    return TOKEN.sub(blank, text)


def item_end(text: str, start: int) -> int:
    """Where the item starting at ``start`` ends: its balanced ``{...}`` or its ``;``."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        elif c == ";" and depth == 0:
            return i + 1
    return len(text)


def without_test_items(text: str) -> str:
    """The source without the items under ``#[cfg(test)]``."""
    while (found := re.search(r"#\[cfg\(test\)\]", text)) is not None:
        end = item_end(text, found.end())
        text = text[: found.start()] + "\n" * text.count("\n", found.start(), end) + text[end:]
    return text


def rust_modules() -> dict[tuple[str, ...], Path]:
    modules = {}
    for path in sorted(CORE.rglob("*.rs")):
        parts = path.relative_to(CORE).with_suffix("").parts
        if parts[-1] in ("mod", "lib"):
            parts = parts[:-1]
        modules[("crate", *parts)] = path
    return modules


USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
PATH = re.compile(r"\b(?:crate|super|self)(?:\s*::\s*\w+)+")


def use_paths(tree: str) -> list[list[str]]:
    """The paths a ``use`` tree names: ``a::{b, c::d as e}`` -> [a, b], [a, c, d]."""
    tree = re.sub(r"\s+as\s+\w+", "", re.sub(r"\s+", "", tree))
    brace = tree.find("{")
    if brace < 0:
        return [[s for s in tree.split("::") if s]]
    prefix = [s for s in tree[:brace].split("::") if s]
    inner, depth, part, parts = tree[brace + 1 : tree.rfind("}")], 0, "", []
    for c in inner + ",":
        if c == "," and depth == 0:
            parts.append(part)
            part = ""
            continue
        depth += c == "{"
        depth -= c == "}"
        part += c
    return [prefix + sub for p in parts if p for sub in use_paths(p)]


def check_rust() -> int:
    modules = rust_modules()
    stripped = {m: strip_rust(p.read_text()) for m, p in modules.items()}
    # Modules in files of their own declared under `#[cfg(test)]` (`mod tests;`) are tests too.
    tests = {
        (*m, name)
        for m, text in stripped.items()
        for name in re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text)
    }
    modules = {m: p for m, p in modules.items() if not any(m[: len(t)] == t for t in tests)}
    texts = {m: without_test_items(stripped[m]) for m in modules}

    def absolute(module: tuple[str, ...], path: list[str]) -> list[str] | None:
        if not path:
            return None
        head, rest = path[0], path[1:]
        if head == "crate":
            return ["crate", *rest]
        base = list(module)
        if head == "self":
            return [*base, *rest]
        if head == "super":
            while path and path[0] == "super":
                base, path = base[:-1], path[1:]
            return [*base, *path]
        if (*module, head) in modules:  # a child module, named by its own name
            return [*base, *path]
        return None

    # Re-exports: (module, name) -> the absolute path it stands for.
    reexports: dict[tuple[tuple[str, ...], str], list[str]] = {}
    for module, text in texts.items():
        for match in USE.finditer(text):
            if match.group(1):
                for path in use_paths(match.group(2)):
                    full = absolute(module, path)
                    if full and path[-1] not in ("*", "self"):
                        reexports[(module, path[-1])] = full

    def resolve(path: list[str], seen: int = 0) -> tuple[str, ...]:
        deepest = ("crate",)
        for i in range(2, len(path) + 1):
            if tuple(path[:i]) in modules:
                deepest = tuple(path[:i])
            else:
                name = path[i - 1]
                target = reexports.get((deepest, name))
                if target is not None and seen < 20 and tuple(path[: i - 1]) == deepest:
                    return resolve([*target, *path[i:]], seen + 1)
                break
        return deepest

    edges: dict[tuple[str, ...], dict[tuple[str, ...], int]] = defaultdict(dict)
    for module, text in texts.items():
        found: list[tuple[int, list[str]]] = []
        for match in USE.finditer(text):
            if match.group(1):
                continue  # a re-export: the module tree, not a dependency
            line = text.count("\n", 0, match.start()) + 1
            found += [(line, p) for p in use_paths(match.group(2))]
        code = USE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for match in PATH.finditer(code):
            line = code.count("\n", 0, match.start()) + 1
            found.append((line, re.sub(r"\s+", "", match.group(0)).split("::")))
        for line, path in found:
            full = absolute(module, path)
            if full is None:
                continue
            target = resolve(full)
            # A module's own ancestors hold only `mod` and re-export lines (resolved above).
            if target != module and target != module[: len(target)]:
                edges[module].setdefault(target, line)
    graph = {m: set(t) for m, t in edges.items()}
    found_cycles = cycles({"::".join(m): {"::".join(t) for t in ts} for m, ts in graph.items()})
    print(f"rust: {len(modules)} modules, {sum(map(len, edges.values()))} module dependencies")
    print(f"rust: module cycles: {len(found_cycles)}")
    named = {"::".join(m): {"::".join(t) for t in ts} for m, ts in graph.items()}
    for component in found_cycles:
        circle = one_circle(named, component)
        print(f"  cycle ({len(component)} modules): {' -> '.join(circle)}")
        for a, b in zip(circle, circle[1:]):
            ma, mb = tuple(a.split("::")), tuple(b.split("::"))
            print(f"    {modules[ma].relative_to(ROOT)}:{edges[ma][mb]}: uses {b}")
    return len(found_cycles)


def main(argv: list[str]) -> int:
    languages = {"--python", "--rust"} & set(argv) or {"--python", "--rust"}
    failures = 0
    if "--python" in languages:
        failures += check_python()
    if "--rust" in languages:
        failures += check_rust()
    if failures:
        print(f"imports: {failures} problem(s), listed above", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
