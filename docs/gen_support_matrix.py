"""The support matrix page, generated from the code at site build time.

Each row is one operation of the sample table (``opendnn.samples.samples("small")``, the problems
every backend is tested on): the dtypes, layouts and variants its samples cover, the backends the
dispatch table (``opendnn.core.dispatch.OPERATIONS``) registers for it, and the cuDNN-shaped call that
reports its workspace size, where it has one. ``python docs/gen_support_matrix.py`` prints the page.
"""

from __future__ import annotations

import opendnn
from opendnn.core.dispatch import OPERATIONS
from opendnn.samples import FAMILIES, Sample

# the cuDNN-shaped workspace queries whose names do not follow get_<op>_workspace_size
WORKSPACE_QUERY = {
    "reduce_tensor": "get_reduction_workspace_size",
    "bn_forward_training": "get_batch_normalization_forward_training_ex_workspace_size",
    "bn_backward": "get_batch_normalization_backward_ex_workspace_size",
}


def workspace(op: str) -> str:
    """The call that sizes ``op``'s workspace, or "none"."""
    query = WORKSPACE_QUERY.get(op, f"get_{op}_workspace_size")
    return f"`{query}`" if hasattr(opendnn, query) else "none"


def matrix_rows() -> list[tuple[str, list[Sample]]]:
    """(family, samples of one op) in the sample table's order."""
    rows: dict[tuple[str, str], list[Sample]] = {}
    for family in FAMILIES:  # opendnn.families.<family>.samples
        for sample in family.samples("small"):
            rows.setdefault((family.__name__.split(".")[-2], sample.op), []).append(sample)
    return [(family, samples) for (family, _), samples in rows.items()]


def page() -> str:
    lines = [
        "# Support matrix",
        "",
        "What each operation is tested with: every row lists the dtypes, layouts and variants of its samples in",
        "`opendnn.samples` (the table the test suite runs on the NumPy reference and, through Triton's",
        "interpreter, on the Triton kernels, and `pytest -m gpu` on a GPU), the backends the dispatch",
        "registers for it and the call that sizes its workspace. Layouts: *packed* (contiguous), *nhwc*",
        "(channels last), *permuted* (another dimension order) and *subregion* (a strided view into a",
        "larger buffer). This page is generated from the code when the site is built.",
        "",
        "| family | operation | dtypes | layouts | variants | backends | workspace |",
        "|---|---|---|---|---|---|---|",
    ]
    for family, samples in matrix_rows():
        op = samples[0].op
        dtypes = ", ".join(sorted({s.dtype.value for s in samples}))
        layouts = ", ".join(sorted({s.layout for s in samples}))
        variants = len({s.variant for s in samples})
        backends = ", ".join(OPERATIONS[family].backends)  # a family folder is its dispatch operation
        lines.append(f"| {family} | `{op}` | {dtypes} | {layouts} | {variants} | {backends} | {workspace(op)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(page())
