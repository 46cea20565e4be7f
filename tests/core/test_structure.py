"""The core's layers only point down: no import cycle among rl_triton_core's modules
(the benchmark sub-package ``bench`` included), no function-local import of a sibling
module except the backends' lazy ones (Triton and numba are imported on first use, so
the CPU path runs without Triton), and no core module imports the package itself
(``rl_triton_core/__init__.py``, which imports them) or anything in ``bench``, which sits
above the core: bench modules may import the core, and import peers and heavy
frameworks inside functions where that is their point."""

import ast
import importlib.machinery
import pathlib

import rl_triton_core

PKG = pathlib.Path(rl_triton_core.__file__).parent
BENCH = PKG / "bench"
INIT = "__init__"  # the package itself: `import rl_triton_core`, `from rl_triton_core import gae`
# (importer, imported) pairs allowed inside a function: the lazy backends
LAZY = {("scan._dispatch", "scan._launch"), ("scan._dispatch", "scan._cpu"),
        ("tokens", "token._token_kernel"), ("tokens", "token._token_cpu"),
        ("scan._dispatch", "scan._cpu_first"), ("scan._cpu_first", "scan._cpu"),
        ("scan._from_actions", "scan._actions"), ("tokens", "_tl"),
        ("groups", "token._group_kernel"), ("groups", "_tl")}
SUBPACKAGES = ("scan", "token", "bench")


def _is_extension(folder, name):
    """A C extension (``_cscan``, ``_ctoken``): built, or its source where it was not.
    A leaf (C imports nothing of ours back), so not a node of the graph."""
    return (folder / f"{name}.c").exists() or any(
        (folder / f"{name}{s}").exists() for s in importlib.machinery.EXTENSION_SUFFIXES)


def _module(parts):
    """The graph's name of ``rl_triton_core.<parts>`` (parts after the package name):
    "_report", "bench.peers", "__init__" (the package), "bench.__init__"; None for
    a C extension or a name that is no module file (an attribute: the caller decides)."""
    folder, prefix = PKG, ""
    for i, p in enumerate(parts):
        if (folder / p / "__init__.py").exists():
            folder, prefix = folder / p, f"{prefix}{p}."
            continue
        if (folder / f"{p}.py").exists() and i == len(parts) - 1:
            return prefix + p
        return None
    return prefix + INIT


def _deps(node, mod):
    """The modules an import statement in module ``mod`` names: for ``from X import n``
    each ``n`` that is a module, else X itself (``from rl_triton_core import __version__``
    imports the package's ``__init__``)."""
    if isinstance(node, ast.Import):
        return [m for a in node.names if (a.name + ".").startswith("rl_triton_core.")
                for m in [_module(a.name.split(".")[1:])] if m]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: resolve against the importer's package
        pkg = mod.split(".")[:-1][: len(mod.split(".")) - node.level]
        base = pkg + (node.module.split(".") if node.module else [])
    elif node.module and (node.module + ".").startswith("rl_triton_core."):
        base = node.module.split(".")[1:]
    else:
        return []
    out = []
    for a in node.names:
        sub = _module(base + [a.name])  # a module, or a sub-package (its __init__)
        if sub is None and not _is_extension(PKG.joinpath(*base), a.name):
            sub = _module(base)  # a name defined in X: X's module (or __init__)
        if sub is not None:
            out.append(sub)
    return out


def _local_imports(tree):
    """{id(import node): inside a function?} for every import in ``tree``; imports in a
    module-level ``try`` or ``if`` run at import time, so they count as module level."""
    found = {}

    def walk(node, in_func):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found[id(child)] = (child, in_func)
            walk(child, in_func or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return found.values()


def _imports():
    """module -> {(imported module, at module level?)} for the package's modules: the
    core's ("_report", "__init__", "scan._launch", "token.__init__") and bench's
    ("bench.peers", "bench.__init__")."""
    graph = {}
    for path in sorted(PKG.glob("*.py")) + sorted(
            p for sub in SUBPACKAGES for p in (PKG / sub).glob("*.py")):
        mod = ("" if path.parent == PKG else path.parent.name + ".") + path.stem
        tree = ast.parse(path.read_text())
        graph[mod] = {(d, not in_func) for node, in_func in _local_imports(tree)
                      for d in _deps(node, mod) if d != mod}
    return graph


def _core(mod):
    """A module of the core: the package's modules and its sub-packages' but bench's,
    not the package's ``__init__``."""
    return not mod.startswith("bench.") and mod != INIT


def _cycle(graph):
    """The first import cycle found in ``graph`` (module -> imported modules), or None."""
    state = {}

    def visit(m, stack):
        if state.get(m) == 1:
            return stack[stack.index(m):] + [m]
        if state.get(m) == 2:
            return None
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            found = visit(d, stack + [m])
            if found:
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        found = visit(m, [])
        if found:
            return found
    return None


def test_the_walk_sees_the_modules_and_their_imports():
    """The walk sees the real modules, bench's included, and the imports the checks below
    are about (so an empty graph cannot pass them)."""
    graph = _imports()
    assert {"estimators", "scan._kernel", "token._token_kernel", "_version", INIT,
            "scan.__init__", "bench.peers", "bench.ext_peers", "bench.harness",
            "bench._inputs", "bench.__init__"} <= set(graph)
    assert ("scan._launch", True) in graph["scan._dispatch"] or (
        "scan._launch", False) in graph["scan._dispatch"]
    assert ("_record", True) in graph["scan._launch"]
    assert ("_version", True) in graph[INIT] and ("_version", True) in graph["_report"]
    assert ("bench.ext_peers", True) in graph["bench.peers"]
    assert ("bench._inputs", True) in graph["bench.peers"]
    assert (INIT, True) in graph["bench.cpu_peers"]        # import rl_triton_core as rc
    assert ("tokens", False) in graph["bench.cpu_tokens"]  # the core's tokens, not bench's
    assert ("bench.peers", False) in graph["bench.harness"]
    assert not any(d.endswith("._cscan") or d.endswith("._ctoken")
                   for deps in graph.values() for d, _ in deps)  # C extensions: leaves


def test_no_import_cycle():
    """Anywhere in the package: the core, bench and the package's ``__init__``; a
    function-local import counts too."""
    cycle = _cycle({m: {d for d, _ in deps} for m, deps in _imports().items()})
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_function_local_sibling_imports():
    """In the core; bench's function-local imports (optional peers, heavy frameworks,
    the harness's subcommands) are allowed (its cycles are not: above)."""
    local = sorted((m, d) for m, deps in _imports().items() if _core(m)
                   for d, top in deps if not top and (m, d) not in LAZY)
    assert not local, f"function-local imports of sibling modules: {local}"


def test_the_sub_packages_do_not_import_each_other():
    """The scan (``scan``) and the token estimators (``token``) share what they share
    through the package's own modules (``_host``, ``_tl``, ``_table``, ...), never by
    importing each other's."""
    cross = sorted((m, d) for m, deps in _imports().items() for d, _ in deps
                   for a, b in (("scan.", "token."), ("token.", "scan."))
                   if m.startswith(a) and d.startswith(b))
    assert not cross, f"imports between the sub-packages: {cross}"


def test_core_imports_neither_the_package_nor_bench():
    """A core module (rl_triton_core/*.py but ``__init__``) imports the modules below
    it, never the package (``import rl_triton_core``, ``from rl_triton_core import
    __version__``: its ``__init__`` imports the core) nor anything in ``bench``."""
    up = sorted((m, d) for m, deps in _imports().items() if _core(m)
                for d, _ in deps if d == INIT or d.startswith("bench."))
    assert not up, f"core modules importing the package or bench: {up}"


def test_cpu_modules_do_not_import_triton():
    """Only the Triton launcher and kernel import triton (the CPU path must not)."""
    for path in list(PKG.glob("*.py")) + list(PKG.glob("scan/*.py")) + list(
            PKG.glob("token/*.py")):
        tree = ast.parse(path.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        uses = any(m == "triton" or m.startswith("triton.") for m in mods)
        assert uses == (path.stem in ("_launch", "_kernel", "_token_kernel", "_group_kernel",
                                     "_actions", "_tl")), \
            path.stem
