"""The core's layers only point down: no import cycle among rl_triton_core's modules,
and no function-local import of a sibling module except the backends' lazy ones
(Triton and numba are imported on first use, so the CPU path runs without Triton)."""

import ast
import pathlib

import rl_triton_core

PKG = pathlib.Path(rl_triton_core.__file__).parent
# (importer, imported) pairs allowed inside a function: the lazy backends
LAZY = {("_dispatch", "_launch"), ("_dispatch", "_cpu"), ("tokens", "_token_kernel"),
        ("tokens", "_token_cpu"), ("_dispatch", "_cpu_first"), ("_cpu_first", "_cpu"),
        ("estimators", "_actions")}


def _imports():
    """module -> {(imported sibling, at module level?)} for the core's top-level modules."""
    graph = {}
    for path in PKG.glob("*.py"):
        mod = path.stem
        tree = ast.parse(path.read_text())
        top = set(id(n) for n in tree.body)
        deps = set()
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "rl_triton_core":
                    names = [a.name for a in node.names]
                elif node.module.startswith("rl_triton_core."):
                    names = [node.module.split(".")[1]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names
                         if a.name.startswith("rl_triton_core.")]
            for n in names:
                if (PKG / f"{n}.py").exists():
                    deps.add((n, id(node) in top))
        graph[mod] = deps
    return graph


def test_no_import_cycle():
    graph = {m: {d for d, _ in deps} for m, deps in _imports().items()}
    state = {}

    def visit(m, stack):
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join(stack + [m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            visit(d, stack + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])
    assert "estimators" in graph and "_kernel" in graph  # the walk saw the real modules


def test_no_function_local_sibling_imports():
    local = sorted((m, d) for m, deps in _imports().items() for d, top in deps
                   if not top and (m, d) not in LAZY)
    assert not local, f"function-local imports of sibling modules: {local}"


def test_cpu_modules_do_not_import_triton():
    """Only the Triton launcher and kernel import triton (the CPU path must not)."""
    for path in PKG.glob("*.py"):
        tree = ast.parse(path.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        uses = any(m == "triton" or m.startswith("triton.") for m in mods)
        assert uses == (path.stem in ("_launch", "_kernel", "_token_kernel", "_actions")), \
            path.stem
