"""mkdocs hooks: the pages built from the repository at site build time.

- ``support-matrix.md``: ``gen_support_matrix.page()``, from the sample table and the dispatch table.
- ``benchmarks.md``: the repository's ``BENCHMARKS.md`` with its chart, its links made site links.
- Design pages link to ``../../BENCHMARKS.md`` (right when read in the repository); on the site those
  links go to ``benchmarks.md``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

DOCS = Path(__file__).parent
ROOT = DOCS.parent
CHART = "benchmarks/results/h200.png"
REPOSITORY_BENCHMARKS = re.compile(r"\]\((?:\.\./)+BENCHMARKS\.md")


def support_matrix() -> str:
    sys.path.insert(0, str(DOCS))
    try:
        from gen_support_matrix import page
    finally:
        sys.path.remove(str(DOCS))
    return page()


def benchmarks() -> str:
    text = (ROOT / "BENCHMARKS.md").read_text()
    results = CHART.rsplit("/", 1)[0]
    # the results file is data, not a page: name it; the chart is copied beside the page
    text = re.sub(rf"\[([^\]]*)\]\({re.escape(results)}/[^)]*\.json\)", r"`\1`", text)
    return text.replace(f"]({CHART})", f"]({Path(CHART).name})")


def on_files(files: Files, config: Any) -> Files:
    for name, content in (("support-matrix.md", support_matrix()), ("benchmarks.md", benchmarks())):
        files.append(File.generated(config, name, content=content))
    files.append(File.generated(config, Path(CHART).name, abs_src_path=str(ROOT / CHART)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    depth = page.file.src_uri.count("/")
    return REPOSITORY_BENCHMARKS.sub("](" + "../" * depth + "benchmarks.md", markdown)
