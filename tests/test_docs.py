"""Every public name of ``opendnn`` and ``opendnn.functional`` has its own docstring.

The documentation site's API reference is generated from these docstrings (mkdocstrings), so a
name without one would appear there as a bare signature. The site build itself runs in CI
(``mkdocs build --strict``), not here.
"""

import inspect
from pathlib import Path

import pytest

import opendnn
import opendnn.functional


def public_names(module: object) -> list[str]:
    """``module.__all__``, or its public names where it declares none."""
    names = getattr(module, "__all__", None)
    return list(names) if names is not None else [n for n in dir(module) if not n.startswith("_")]


def own_docstring(value: object) -> str:
    """The docstring ``value`` declares itself: not inherited, not a dataclass's generated signature."""
    doc = vars(value).get("__doc__") if inspect.isclass(value) else getattr(value, "__doc__", None)
    doc = (doc or "").strip()
    if inspect.isclass(value) and doc.startswith(f"{value.__name__}("):
        return ""  # dataclasses write "Name(field: type, ...)" where the class has no docstring
    return doc


DOCUMENTED = [
    (module.__name__, name)
    for module in (opendnn, opendnn.functional)
    for name in public_names(module)
    if inspect.isfunction(getattr(module, name)) or inspect.isclass(getattr(module, name))
]


def test_the_public_names_are_found() -> None:
    names = {name for _, name in DOCUMENTED}
    assert {"convolution_forward", "TensorDescriptor", "add", "relu_backward", "conv"} <= names
    assert len(DOCUMENTED) > 150


@pytest.mark.parametrize(("module", "name"), DOCUMENTED)
def test_public_name_has_a_docstring(module: str, name: str) -> None:
    value = getattr(opendnn if module == "opendnn" else opendnn.functional, name)
    assert own_docstring(value), f"{module}.{name} has no docstring"


def test_the_support_matrix_has_a_row_for_every_sample_operation(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "docs"))
    from gen_support_matrix import page

    from opendnn.samples import samples

    text = page()
    missing = sorted({sample.op for sample in samples("small")} - {op for op in text.split("`")[1::2]})
    assert not missing, f"no row for {missing}"
