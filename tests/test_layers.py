"""The package's layers, read from the code's own imports (docs/architecture.md draws them), those made inside a
function (lazy ones) counted as any other: no import reaches up a floor, no module imports itself through a circle,
the floors stay few (the package's and each subpackage's own), and an import made inside a function says why
(`# lazy:`)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ts_trl"
# docs/architecture.md, "Layers": a module may import its own subpackage or a lower floor.
FLOORS = {
    "method": 1,
    "rewards": 1,
    "tiny": 1,
    "smollm2": 2,  # the real model: a cached conversion (resources)
    "resources": 1,
    "flags": 1,  # how every command spells its flags (argparse only)
    "store": 2,
    "data": 3,  # training data: loaders and columns (store.schema)
    "trainer": 3,
    "embedded": 4,
    "cli": 5,
    "analysis": 6,
    "__main__": 7,
    "__init__": 7,  # the public names, exported lazily from every floor
}


def _modules() -> dict[str, Path]:
    return {
        ".".join(("ts_trl", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): path
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _imports(name: str, path: Path) -> list[tuple[str, ast.AST, bool]]:
    """The ts_trl modules `name` imports: (target, node, made inside a function)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.startswith("ts_trl"):
                    for alias in child.names:  # `from . import x` may name a module
                        candidate = f"{target}.{alias.name}"
                        found.append((candidate if candidate in MODULES else target, child, inside))
            elif isinstance(child, ast.Import):
                found.extend((a.name, child, inside) for a in child.names if a.name.startswith("ts_trl"))
            visit(child, inside)

    visit(tree, False)
    return found


def _floor(module: str) -> tuple[str, int]:
    part = module.split(".")[1] if "." in module else "__init__"
    return part, FLOORS[part]


MODULES = _modules()
MOST_FLOORS = 7  # the package, counted from the imports of its rooms (subpackages and top-level modules)
MOST_FLOORS_INSIDE = {"store": 3}  # a subpackage's own floors, counted from imports among its modules; others: 4
DEFAULT_FLOORS_INSIDE = 4


def _module_graph() -> dict[str, set[str]]:
    """Module -> the ts_trl modules it imports, at module level or inside a function (a lazy import defers the
    import, not the dependency: a circle through one is still a circle)."""
    return {
        name: {t for t, _, _ in _imports(name, path) if t in MODULES and t != name} for name, path in MODULES.items()
    }


def _floors_of(graph: dict[str, set[str]]) -> dict[str, int]:
    """Each node's floor: 1 for a node that imports nothing of the graph, else one above the highest it imports."""
    floors: dict[str, int] = {}

    def floor(node, seen=()):
        if node not in floors:
            below = [floor(n, (*seen, node)) for n in graph[node] if n not in seen]
            floors[node] = 1 + max(below, default=0)
        return floors[node]

    for node in graph:
        floor(node)
    return floors


def test_every_module_has_a_floor():
    assert not [m for m in MODULES if _floor(m)[0] not in FLOORS]


def test_no_import_reaches_up_a_floor():
    upward = []
    for name, path in MODULES.items():
        room, floor = _floor(name)
        for target, node, _ in _imports(name, path):
            target_room, target_floor = _floor(target)
            if target_room != room and target_floor >= floor:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {target}")
    assert not upward, "\n".join(upward)


def test_no_circle_among_imports_lazy_ones_included():
    graph = _module_graph()
    state, circles = {}, []

    def walk(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                walk(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert not circles, "\n".join(circles)


def test_no_module_imports_a_private_name_of_another():
    """A name with a leading underscore is its module's own: another module that needs it gets a public name."""
    private = []
    for name, path in MODULES.items():
        for _, node, _ in _imports(name, path):
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if any(n.startswith("_") and not n.startswith("__") for n in names):
                private.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {', '.join(names)}")
    assert not private, "\n".join(private)


def test_an_import_inside_a_function_says_why():
    unexplained = []
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and "# lazy:" not in lines[node.lineno - 1]:
                    unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {lines[node.lineno - 1]}")
    assert not unexplained, "\n".join(unexplained)


def test_each_subpackage_keeps_few_floors_of_its_own():
    """Inside a subpackage any import is allowed by the floors above, so its own depth is bounded here: a chain of
    five modules each importing the next is a house within the house that no picture of the package shows."""
    graph = _module_graph()
    too_deep = []
    for room in {name.split(".")[1] for name in MODULES if name.count(".") >= 2}:
        inside = {n for n in graph if n.startswith(f"ts_trl.{room}.")}
        floors = _floors_of({n: graph[n] & inside for n in inside})
        most = MOST_FLOORS_INSIDE.get(room, DEFAULT_FLOORS_INSIDE)
        if max(floors.values()) > most:
            chain = sorted(floors, key=floors.get, reverse=True)
            too_deep.append(f"ts_trl/{room}/: {max(floors.values())} floors (at most {most}), {chain[0]} on top")
    assert not too_deep, "\n".join(too_deep)


def test_the_package_keeps_seven_floors():
    rooms: dict[str, set[str]] = {}
    for name, targets in _module_graph().items():
        room = _floor(name)[0]
        rooms.setdefault(room, set()).update(_floor(t)[0] for t in targets if _floor(t)[0] != room)
    assert max(_floors_of(rooms).values()) <= MOST_FLOORS


def test_a_function_over_50_lines_says_why_it_reads_best_whole():
    """STYLE.md's small functions: one over 50 lines (signature and docstring included) gives its reason in its
    docstring, after `Long:`."""
    unexplained = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50:
                if "Long:" not in (ast.get_docstring(node) or ""):
                    unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert not unexplained, "\n".join(unexplained)
