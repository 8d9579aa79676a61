"""The packages keep the architecture ARCHITECTURE.md draws:

* their import contracts hold (pyproject.toml's [tool.importlinter], run by import-linter): each
  folder's imports point one way, no circle between siblings at any depth, optional extras only
  where pauliprop converts or plots and stim only where stabilizer converts to Stim's objects, and of
  pauliprop stabilizer reads only the gate table (and the Pallas kernels' dialect stand-in);
* no circle of imports among their modules (grimp's graph, which holds the imports inside functions
  too, the usual hiding place of a circle);
* no private name (one leading underscore) is used outside the module that defines it: no
  `from module import _name`, and no `module._name` through a module of the package.

Each test takes the package as a parameter, so a package joins by being named in PACKAGES (and, for
the contracts, in the configuration's root_packages with contracts whose ids start with its name).
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

importlinter_api = pytest.importorskip("importlinter.api", reason="needs import-linter (pip install -e '.[test]')")
grimp = pytest.importorskip("grimp", reason="needs grimp (import-linter's graph; pip install -e '.[test]')")

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG = REPO_ROOT / "pyproject.toml"
PACKAGES = ["pauliprop", "stabilizer"]


def _package_dir(package: str) -> Path:
    return Path(importlib.util.find_spec(package).origin).parent


def _module_name(package: str, path: Path) -> str:
    parts = path.relative_to(_package_dir(package).parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@pytest.mark.parametrize("package", PACKAGES)
def test_the_import_contracts_hold(package):
    contracts = [c["id"] for c in importlinter_api.read_configuration(str(CONFIG))["contracts_options"]
                 if c["id"].startswith(f"{package}-")]
    assert contracts, f"pyproject.toml has no import contract for {package} (ids start with '{package}-')"
    command = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
               "sys.exit(lint_imports_command())", "--config", str(CONFIG), "--no-cache", "--no-logo"]
    for contract in contracts:
        command += ["--contract", contract]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]


def _cycles(graph, modules) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, imported = work[-1]
            step = next(imported, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.find_modules_directly_imported_by(step)))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1 or module in graph.find_modules_directly_imported_by(module):
                    found.append(sorted(component))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_itself_through_a_circle(package):
    graph = grimp.build_graph(package)
    cycles = _cycles(graph, graph.modules)
    circles = []
    for component in cycles:  # one circle through the component's first module, to show where it runs
        first = component[0]
        step = sorted(set(graph.find_modules_directly_imported_by(first)) & set(component))[0]
        back = (first,) if step == first else graph.find_shortest_chain(importer=step, imported=first)
        circles.append(" -> ".join((first, *back)))
    assert not cycles, "import circles:\n" + "\n".join(circles)


def _c_extension_beside(path: Path, base: str, name: str) -> bool:
    """Whether `from base import name` in `path` imports a C extension of path's own folder (native.py's
    _native, from _native.c): the modules beside it may import it; those of other folders may not."""
    return base.split(".")[-1] == path.parent.name and (path.parent / f"{name}.c").exists()


def _private_uses(package: str, path: Path, package_modules: set[str]) -> list[str]:
    """`from <package module> import _name` and `<alias of a package module>._name` in one file."""
    me = _module_name(package, path)
    tree = ast.parse(path.read_text(), filename=str(path))
    here = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    modules, found = {}, []  # local name -> the package module it names
    is_module = package_modules.__contains__

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
            if base.split(".")[0] != package:
                continue
            for alias in node.names:
                if _private(alias.name) and not _c_extension_beside(path, base, alias.name):
                    found.append(f"{path}:{node.lineno}: from {base} import {alias.name}")
                elif is_module(f"{base}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == package:
                    modules[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else package
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)  # x = importlib.import_module(...)
              and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "import_module"):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    modules[target.id] = "importlib.import_module(...)"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and _private(node.attr)):
            found.append(f"{path}:{node.lineno}: {node.value.id}.{node.attr} ({modules[node.value.id]})")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_name_is_used_outside_its_module(package):
    files = sorted(_package_dir(package).rglob("*.py"))
    package_modules = {_module_name(package, path) for path in files}
    assert files
    found = [use for path in files for use in _private_uses(package, path, package_modules)]
    assert not found, "private names used outside their modules:\n" + "\n".join(found)
