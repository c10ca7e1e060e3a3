"""The public API may grow but never lose a name or change a signature without a deprecation.

``api_snapshot.json`` records every public name of ``opendnn`` and ``opendnn.functional`` with its
signature. Regenerate it after an intended addition: ``python tests/test_api_stability.py --update``.
A signature may grow only in ways that keep every call it accepted meaning the same: new parameters
with defaults after the recorded positional ones or among the keyword-only ones, and a keyword-only
parameter that becomes positional after the recorded positional ones (torch's ``ceil_mode``).
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


def parameters(signature: str) -> tuple[list[str], dict[str, str], str]:
    """A signature's text as (its positional parameters, its keyword-only parameters by name, its
    return annotation); each parameter is its text (name, annotation, default)."""
    body, _, returns = signature.partition(") -> ")
    parts, depth, quote, start = [], 0, "", 1
    for k, char in enumerate(body):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{<":
            depth += 1
        elif char in ")]}>":
            depth -= 1
        elif char == "," and depth == 1:
            parts.append(body[start:k].strip())
            start = k + 1
    parts.append(body[start:].strip())
    parts = [p for p in parts if p and p != "/"]
    star = next((k for k, p in enumerate(parts) if p.startswith("*") and not p.startswith("**")), len(parts))
    keyword = {p.split(":")[0].split("=")[0].strip(): p for p in parts[star + 1 :]}
    var_positional = [p for p in parts[star : star + 1] if p != "*"]  # a *args stays among the positional ones
    return parts[:star] + var_positional, keyword, returns


def compatible(recorded: str, current: str) -> bool:
    """Whether every call ``recorded`` accepts means the same under ``current``."""
    if recorded.startswith("enum "):
        return current.startswith("enum ") and set(recorded[5:].split(",")) <= set(current[5:].split(","))
    old_positional, old_keyword, old_returns = parameters(recorded)
    new_positional, new_keyword, new_returns = parameters(current)
    if old_returns != new_returns or new_positional[: len(old_positional)] != old_positional:
        return False
    added = new_positional[len(old_positional) :]
    for name, text in old_keyword.items():
        if new_keyword.get(name) != text and text not in added:
            return False
    new_parameters = added + [text for name, text in new_keyword.items() if name not in old_keyword]
    return all(" = " in text or text in old_keyword.values() or text.startswith("*") for text in new_parameters)


def test_compatible_accepts_growth_and_refuses_changes():
    old = "(x: 'Any', k: 'int', stride: 'int' = 1, *, ceil_mode: 'bool' = False) -> 'Any'"
    assert compatible(old, "(x: 'Any', k: 'int', stride: 'int' = 1, d: 'int' = 1, ceil_mode: 'bool' = False) -> 'Any'")
    assert compatible(
        old, "(x: 'Any', k: 'int', stride: 'int' = 1, *, ceil_mode: 'bool' = False, i: 'bool' = False) -> 'Any'"
    )
    assert not compatible(old, "(k: 'int', x: 'Any', stride: 'int' = 1, *, ceil_mode: 'bool' = False) -> 'Any'")
    assert not compatible(
        old, "(x: 'Any', k: 'int', stride: 'int' = 1, d: 'int', *, ceil_mode: 'bool' = False) -> 'Any'"
    )
    assert not compatible(old, "(x: 'Any', k: 'int', stride: 'int' = 1, *, ceil_mode: 'bool' = True) -> 'Any'")
    assert not compatible(old, "(x: 'Any', k: 'int', stride: 'int' = 1) -> 'Any'")
    assert not compatible(old, "(x: 'Any', k: 'int', stride: 'int' = 1, *, ceil_mode: 'bool' = False) -> 'int'")
    assert compatible("enum A,B", "enum A,B,C") and not compatible("enum A,B", "enum A")


def test_no_public_name_disappears_or_changes_signature():
    recorded = json.loads(SNAPSHOT.read_text())
    current = public_api()
    missing = sorted(set(recorded) - set(current))
    changed = sorted(n for n in recorded if n in current and not compatible(recorded[n], current[n]))
    assert not missing, f"public names removed: {missing}"
    assert not changed, f"signatures changed: {[(n, recorded[n], current[n]) for n in changed]}"


if __name__ == "__main__" and "--update" in sys.argv:
    SNAPSHOT.write_text(json.dumps(public_api(), indent=1, sort_keys=True) + "\n")
