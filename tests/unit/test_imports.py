"""The house's rules, checked on the code itself: no import circle (imports inside functions
count), the contract below the services, and a service reaching into another only through
what that one offers (its settings section, or a module named here with the reason)."""

from __future__ import annotations

import ast
from pathlib import Path

from ..support.paths import REPO

PACKAGE = REPO / "claw_stream"
# the contract every part shares; __init__: the package itself (its version)
CONTRACT = {
    "__init__",
    "events",
    "ids",
    "names",
    "dialect",
    "next_state",
    "resources",
    "timerange",
    "tenants",
    "skills",  # what a skill is, whose, its text rules: the worker learns, the gateway adds
    "plugins",
    "api",
    "bus",
    "store",
}
# task datasets, checkers and the episode runner (over HTTP); the coding agents (connecting
# one, the doctor, recognising their calls, their names), used by the CLI and the gateway;
# the HTTP apps' error handlers (FastAPI), used by the gateway and the engine
LIBRARIES = {"tasks", "agents", "http_errors"}
WEB = ("fastapi", "starlette")  # what the contract never imports
SERVICES = {
    "gateway",
    "worker",
    "trainer",
    "engine",
    "evaluation",
    "versions",
    "embedded",
    "console",
}
# what a service offers the others besides its package and its `config` (settings section)
OFFERED = {
    # a candidate is evaluated, then decided; the watchdog compares versions' held-out scores
    # and both, and gated promotion, replay the held-out turns of real conversations
    ("versions", "evaluation"): {
        "records",
        "service",
        "held_out",
        "held_out_records",
        "replay",
    },
    # the gateway serves the console at /console
    ("gateway", "console"): {"api_router", "service"},
    # the console's rollback button is the CLI's code; its overview draws the report's curve
    ("console", "versions"): {"rollback"},
    ("console", "evaluation"): {"report"},
    # the trainer numbers, records and pushes each version it makes, prunes its checkpoints,
    # and goes on from the serving version (serving_view, following)
    ("trainer", "versions"): {
        "records",
        "numbering",
        "push",
        "checkpoints",
        "serving_view",
        "following",
    },
    # forgetting a tenant unloads its adapters from the engines
    ("gateway", "versions"): {"push"},
    # the worker archives claw.weights into weight_versions by the writers' one rule
    ("worker", "versions"): {"records"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, package: str) -> set[str]:
    """Every claw_stream name imported anywhere in the module, functions included; imports
    only for the type checker are left out (they never run)."""
    names: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return {n for n in names if n == "claw_stream" or n.startswith("claw_stream.")}


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for imported in _imported(ast.parse(path.read_text()), package):
            while imported not in modules:  # a name inside a module: that module
                imported = imported.rsplit(".", 1)[0]
            if imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    found.append(sorted(component))
    return found


def _part(module: str) -> tuple[str, str]:
    """(top-level part, module within it): claw_stream.gateway.sessions.auth -> (gateway, auth)."""
    parts = module.split(".")[1:] or ["__init__"]
    return parts[0], ".".join(parts[1:]) or "__init__"


def trespasses(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in graph.items():
        here, _ = _part(module)
        for target in targets:
            there, inner = _part(target)
            if there == here:
                continue
            if here in CONTRACT and there not in CONTRACT:
                out.append(f"{module} -> {target}: the contract imports no service")
            elif here in LIBRARIES and there in SERVICES:
                out.append(f"{module} -> {target}: a library imports no service")
            elif here in SERVICES and there in SERVICES:
                offered = {"__init__", "config"} | OFFERED.get((here, there), set())
                if inner.split(".")[0] not in offered:
                    out.append(f"{module} -> {target}: another service's internals")
            elif here == "settings" and there in SERVICES:
                if inner != "config":  # settings.py assembles every package's section
                    out.append(f"{module} -> {target}: settings read only sections")
            elif here in SERVICES and there not in CONTRACT | LIBRARIES | SERVICES | {"settings"}:
                out.append(f"{module} -> {target}: a service imports no command")
    return sorted(out)


def test_no_import_circle() -> None:
    assert circles(import_graph()) == []


def test_the_walk_finds_a_circle_through_a_function() -> None:
    graph = {"claw_stream.a": {"claw_stream.b"}, "claw_stream.b": {"claw_stream.a"}}
    assert circles(graph) == [["claw_stream.a", "claw_stream.b"]]
    tree = ast.parse("def f():\n    from claw_stream.x import y\n")
    assert _imported(tree, "claw_stream") == {"claw_stream.x", "claw_stream.x.y"}
    guarded = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import claw_stream.z\n"
    )
    assert _imported(guarded, "claw_stream") == set()


def test_no_service_reaches_into_another() -> None:
    assert trespasses(import_graph()) == []


def test_the_contract_imports_no_web_framework() -> None:
    """The contract holds shapes and rules every part shares; the HTTP apps' handlers are a
    library's (`http_errors.py`)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        if _part(_module_name(path))[0] not in CONTRACT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            found += [f"{_module_name(path)}: {n}" for n in names if n.split(".")[0] in WEB]
    assert found == []


def test_a_trespass_is_named() -> None:
    graph = {
        "claw_stream.trainer.service": {
            "claw_stream.gateway.sessions.auth",
            "claw_stream.gateway.config",
        },
        "claw_stream.store.db": {"claw_stream.worker.worker"},
    }
    assert trespasses(graph) == [
        "claw_stream.store.db -> claw_stream.worker.worker: the contract imports no service",
        "claw_stream.trainer.service -> claw_stream.gateway.sessions.auth: another service's internals",
    ]


def test_no_class_over_400_lines_and_no_module_over_600() -> None:
    """Small modules with names that say what they hold: a class past 400 lines or a module
    past 600 is split along its parts (docs/architecture.md's code layout names them)."""
    too_big = []
    for path in PACKAGE.rglob("*.py"):
        source = path.read_text()
        if source.count("\n") > 600:
            too_big.append(f"{path.relative_to(REPO)}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > 400:
                    too_big.append(f"{path.relative_to(REPO)}: class {node.name}, {size} lines")
    assert too_big == []
