"""The public API may grow but never lose a name or change a signature without a deprecation.

``api_snapshot.json`` records every public name of ``opendnn`` and ``opendnn.functional`` with its
signature. Regenerate it after an intended addition: ``python tests/test_api_stability.py --update``.
"""

import inspect
import json
import sys
from pathlib import Path

import opendnn
import opendnn.functional

SNAPSHOT = Path(__file__).with_name("api_snapshot.json")


def public_api() -> dict[str, str]:
    api = {}
    for module in (opendnn, opendnn.functional):
        names = getattr(module, "__all__", None) or [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and inspect.isfunction(v) and v.__module__ == module.__name__
        ]
        for name in names:
            value = getattr(module, name)
            try:
                signature = str(inspect.signature(value)) if callable(value) else type(value).__name__
            except (TypeError, ValueError):
                signature = "(builtin)"
            if inspect.isclass(value) and hasattr(value, "__members__"):
                signature = "enum " + ",".join(value.__members__)
            api[f"{module.__name__}.{name}"] = signature
    return api


def test_no_public_name_disappears_or_changes_signature():
    recorded = json.loads(SNAPSHOT.read_text())
    current = public_api()
    missing = sorted(set(recorded) - set(current))
    changed = sorted(
        n
        for n in recorded
        if n in current
        and current[n] != recorded[n]
        and not (recorded[n].startswith("enum ") and set(recorded[n][5:].split(",")) <= set(current[n][5:].split(",")))
    )
    assert not missing, f"public names removed: {missing}"
    assert not changed, f"signatures changed: {[(n, recorded[n], current[n]) for n in changed]}"


if __name__ == "__main__" and "--update" in sys.argv:
    SNAPSHOT.write_text(json.dumps(public_api(), indent=1, sort_keys=True) + "\n")
