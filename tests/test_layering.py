"""The package's layers import downward only: core imports nothing of opendnn above it, kernels import
core, a family imports core, kernels and its own modules, and another family only through that
family's entry points (its problem, its cuDNN-shaped calls, its Pythonic calls); no family imports the
public faces (opendnn, opendnn.functional, opendnn.samples) or opendnn.torch; the library never
imports the applications (opendnn.apps); no import cycles (imports for type checkers aside). Every
module's imports are read from its source (ast), those inside functions included. ``import opendnn``
loads no backend, no torch and no triton. Every family folder is registered where the dispatch and the
samples find it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import opendnn
from opendnn.core.dispatch import OPERATIONS
from opendnn.samples import FAMILIES

ROOT = Path(opendnn.__file__).resolve().parent
FACES = ("opendnn", "opendnn.functional", "opendnn.samples")
ENTRY_POINTS = ("problem", "functional", "api")  # and any *_api module: a family's cuDNN-shaped calls


def package_sources() -> dict[str, str]:
    """{dotted module name: source} of every module of the opendnn package."""
    sources = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text()
    return sources


def imported_modules(name: str, source: str, modules: set[str], run_time: bool = False) -> set[str]:
    """The opendnn modules that ``name``'s source imports (``from a import b`` names a.b when that is a
    module, else a); ``run_time``: without those under ``if TYPE_CHECKING:``, which never execute."""
    package = name if name in {m.rsplit(".", 1)[0] for m in modules if "." in m} else name.rsplit(".", 1)[0]
    tree = ast.parse(source)
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if run_time and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m == "opendnn" or m.startswith("opendnn.")}


def layer(module: str) -> str:
    """core, kernels, family:<name>, or the module's own name for what sits above the families."""
    parts = module.split(".")
    if parts[1:2] in (["core"], ["kernels"]):
        return parts[1]
    if parts[1:2] == ["families"] and len(parts) > 2:
        return f"family:{parts[2]}"
    return ".".join(parts[:2])


def is_entry_point(module: str) -> bool:
    leaf = module.split(".")[-1]
    return len(module.split(".")) == 4 and (leaf in ENTRY_POINTS or leaf.endswith("_api"))


def upward(importer: str, imported: str) -> str | None:
    """Why ``importer`` may not import ``imported``, or None."""
    source, target = layer(importer), layer(imported)
    if imported == "opendnn._version":  # a leaf that imports nothing: below every layer
        return None
    if target == "opendnn.apps" and source not in ("opendnn.apps", "opendnn.__main__"):
        return "the library never imports the applications"
    if source == "core" and target != "core":
        return "core imports only core"
    if source == "kernels" and target not in ("core", "kernels"):
        return "kernels import only core and kernels"
    if source.startswith("family:"):
        if target in ("core", "kernels", source) or imported == "opendnn.families":
            return None
        if target.startswith("family:"):
            return None if is_entry_point(imported) else "another family only through its problem, api or functional"
        return "a family imports core, kernels and families only"
    return None


def violations(sources: dict[str, str]) -> list[str]:
    modules = set(sources)
    return sorted(
        f"{importer} imports {imported}: {reason}"
        for importer, source in sources.items()
        for imported in imported_modules(importer, source, modules)
        if (reason := upward(importer, imported)) is not None
    )


def import_cycle(sources: dict[str, str]) -> list[str]:
    """A chain of modules each importing the next and the last importing the first at run time, or []."""
    modules = set(sources)
    graph = {
        name: sorted(imported_modules(name, source, modules, run_time=True) & modules - {name})
        for name, source in sources.items()
    }
    state: dict[str, str] = {}  # "open" while on the current path, then "done"

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = "open"
        for nxt in graph[module]:
            if state.get(nxt) == "open":  # on the path: the modules from it to here form the cycle
                return path[path.index(nxt) :] + [module]
            if nxt not in state and (found := visit(nxt, [*path, module])):
                return found
        state[module] = "done"
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module, [])):
            return found
    return []


def test_the_checker_finds_each_kind_of_upward_import():
    sources = {
        "opendnn": "",
        "opendnn.core": "",
        "opendnn.core.handle": "",
        "opendnn.kernels": "",
        "opendnn.kernels.math": "",
        "opendnn.functional": "",
        "opendnn.samples": "",
        "opendnn.torch": "",
        "opendnn.families": "",
        "opendnn.families.a": "",
        "opendnn.families.b": "",
        "opendnn.families.a.problem": "",
        "opendnn.families.a.triton_backend": "",
        "opendnn.families.a.tensor_ops_api": "",
        "opendnn.core.dtypes": "from opendnn.kernels import math",
        "opendnn.core.errors": "def f():\n    import opendnn.families.a.problem",
        "opendnn.kernels.launch": "from opendnn.families.a.problem import Problem",
        "opendnn.kernels.layout": "from opendnn.core.handle import Handle\nfrom opendnn.kernels import math",
        "opendnn.families.b.api": "from opendnn.families.a import triton_backend",
        "opendnn.families.b.functional": "import opendnn.functional as F",
        "opendnn.families.b.samples": "import opendnn as od\nfrom opendnn.samples import relative_error",
        "opendnn.families.b.numpy_backend": "from opendnn.torch import functions",
        "opendnn.apps": "",
        "opendnn.apps.demo": "from opendnn.apps import cli",
        "opendnn.apps.cli": "",
        "opendnn.__main__": "from opendnn.apps.cli import main",
        "opendnn.torch.modules": "from opendnn.apps import demo",
        "opendnn.families.b.problem": "from opendnn.families.a.problem import P\n"
        "from opendnn.families.a import tensor_ops_api\nfrom .api import x",
    }
    assert violations(sources) == [
        "opendnn.core.dtypes imports opendnn.kernels.math: core imports only core",
        "opendnn.core.errors imports opendnn.families.a.problem: core imports only core",
        "opendnn.families.b.api imports opendnn.families.a.triton_backend: another family only through its "
        "problem, api or functional",
        "opendnn.families.b.functional imports opendnn.functional: a family imports core, kernels and families only",
        "opendnn.families.b.numpy_backend imports opendnn.torch: a family imports core, kernels and families only",
        "opendnn.families.b.samples imports opendnn.samples: a family imports core, kernels and families only",
        "opendnn.families.b.samples imports opendnn: a family imports core, kernels and families only",
        "opendnn.kernels.launch imports opendnn.families.a.problem: kernels import only core and kernels",
        "opendnn.torch.modules imports opendnn.apps.demo: the library never imports the applications",
    ]


def test_the_checker_finds_an_import_cycle():
    sources = {
        "opendnn.families.a.x": "from opendnn.families.a import y",
        "opendnn.families.a.y": "def f():\n    from opendnn.families.a.z import g",
        "opendnn.families.a.z": "import opendnn.families.a.x",
        "opendnn.families.a.w": "",
    }
    assert import_cycle(sources) == ["opendnn.families.a.x", "opendnn.families.a.y", "opendnn.families.a.z"]
    assert import_cycle({**sources, "opendnn.families.a.z": ""}) == []
    type_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import opendnn.families.a.x"
    assert import_cycle({**sources, "opendnn.families.a.z": type_only}) == []


def test_no_module_imports_upward():
    sources = package_sources()
    assert {"opendnn.core.dispatch", "opendnn.kernels.launch", "opendnn.families.convolution.triton_backend"} <= set(
        sources
    )
    assert violations(sources) == []


def test_no_import_cycles():
    assert import_cycle(package_sources()) == []


def test_import_opendnn_loads_no_backend_no_torch_no_triton():
    code = (
        "import sys\n"
        f"import {', '.join(FACES)}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')\n"
        "             or m.endswith('_backend') or m.startswith('opendnn.kernels')))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"


def test_every_family_folder_is_registered_with_its_files():
    folders = sorted(p.name for p in (ROOT / "families").iterdir() if (p / "__init__.py").exists())
    assert len(folders) >= 9
    assert sorted(OPERATIONS) == folders
    assert sorted(module.__name__ for module in FAMILIES) == [f"opendnn.families.{f}.samples" for f in folders]
    for family in folders:
        present = {p.name for p in (ROOT / "families" / family).iterdir()}
        assert {"problem.py", "numpy_backend.py", "triton_backend.py", "samples.py"} <= present, family
