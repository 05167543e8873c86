"""The book as its readers see it: notebook pages that open with their verdict, then their figure and table;
the Colab cell's clone URL; formulas typeset offline.

``reader_view`` is what the book job does to every executed notebook before Jupyter Book renders it: code behind a
toggle, the page's verdicts (``report.verdicts.opening_markdown``) after its title. Only the copy the book is built
from changes. Every notebook's first code cell, on Colab only, clones the repository: Colab opens the notebook file
alone, so the cell holds ``_config.yml``'s ``repository.url``, which ``check_colab_cell`` checks and
``python -m diffeqformer.report.book`` writes. As a Sphinx extension this module serves MathJax from the book itself
(a copy from the PyPI package ``sphinx-mathjax-offline``), not from a CDN: the book typesets the same offline.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from .. import paths

CONFIG = paths.REPO / "_config.yml"
COLAB_MARKER = "google.colab"
"""A code cell whose source mentions this is a notebook's Colab cell."""
_GITHUB_URL = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+?(?=\.git\b|[\"'\s/]|$)")
HIDDEN = ("remove-cell", "remove-input", "hide-cell", "hide-input")
"""MyST-NB tags under which a code cell's source is not on the page, or not open."""


def book_config(config: Path = CONFIG) -> dict:
    """``_config.yml``, parsed."""
    import yaml

    return yaml.safe_load(Path(config).read_text())


def repository_url(config: Path = CONFIG) -> str:
    """``repository.url`` of ``_config.yml``, without a trailing slash or ``.git``."""
    return re.sub(r"(\.git)?/*$", "", book_config(config)["repository"]["url"].strip())


def colab_link(notebook: str, config: Path = CONFIG) -> str:
    """The address that a notebook's "Open in Colab" button opens, made as the book's theme makes it from
    ``_config.yml`` (``launch_buttons.colab_url``, ``repository.url``, ``branch`` and ``path_to_book``)."""
    cfg = book_config(config)
    repo = cfg["repository"]
    path = "/".join(p for p in (repo.get("path_to_book", "").strip("/"), "notebooks", f"{notebook}.ipynb") if p)
    return (f"{cfg['launch_buttons']['colab_url'].strip('/')}/github/"
            f"{repository_url(config).removeprefix('https://github.com/')}/blob/{repo.get('branch', 'main')}/{path}")


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def colab_cells(nb: dict) -> list[dict]:
    """The code cells of a notebook (its JSON) that set it up on Colab."""
    return [c for c in nb["cells"] if c["cell_type"] == "code" and COLAB_MARKER in _source(c)]


def check_colab_cell(notebook: Path, config: Path = CONFIG) -> None:
    """Raise ``ValueError``, saying what to do, unless each Colab cell of the notebook (it may have none) clones
    ``_config.yml``'s repository and is tagged ``remove-cell``."""
    url = repository_url(config)
    for cell in colab_cells(json.loads(Path(notebook).read_text())):
        found = sorted(set(_GITHUB_URL.findall(_source(cell))))
        if found != [url]:
            raise ValueError(f"{Path(notebook).name}: its Colab cell clones {', '.join(found) or 'no GitHub URL'}, "
                             f"but _config.yml's repository.url is {url}: "
                             f"`python -m diffeqformer.report.book` writes it into every notebook")
        if "remove-cell" not in cell.get("metadata", {}).get("tags", []):
            raise ValueError(f"{Path(notebook).name}: its Colab cell must be tagged 'remove-cell' (it sets up "
                             f"Colab; a reader of the book does not need it): "
                             f"`python -m diffeqformer.report.book` tags it")


def sync_colab_cells(notebooks: list[Path] | None = None, config: Path = CONFIG) -> list[Path]:
    """Write ``_config.yml``'s repository URL into the Colab cell of each notebook (default: every notebook in
    ``notebooks/``) and tag the cell ``remove-cell``; return the notebooks that changed. Nothing else changes: the
    cell's commands, and the file's layout (keys in their order, one space of indent, as Jupyter writes it)."""
    url = repository_url(config)
    changed = []
    for path in sorted(paths.NOTEBOOKS.glob("*.ipynb")) if notebooks is None else notebooks:
        text = Path(path).read_text()
        nb = json.loads(text)
        for cell in colab_cells(nb):
            if isinstance(cell["source"], list):
                cell["source"] = [_GITHUB_URL.sub(url, line) for line in cell["source"]]
            else:
                cell["source"] = _GITHUB_URL.sub(url, cell["source"])
            tags = cell.setdefault("metadata", {}).setdefault("tags", [])
            if "remove-cell" not in tags:
                tags.append("remove-cell")
        new = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
        if new != text:
            Path(path).write_text(new)
            changed.append(Path(path))
    return changed


def reader_view(nb: dict, opening: str | None = None) -> dict:
    """The notebook (its JSON, changed in place and returned) as the book shows it: every code cell that is not
    removed or hidden already is tagged ``hide-input`` (its outputs stay on the page; its source is behind a toggle).
    Papermill's injected-parameters cell is one of them. What a cell printed (its stream outputs: progress, timings,
    logs) is left out. ``opening`` (Markdown: the page's verdicts), where given, follows the page's title, before the
    rest of its first cell and the cells after it."""
    if opening is not None:
        first = nb["cells"][0]
        title, _, rest = _source(first).partition("\n")
        if first["cell_type"] != "markdown" or not title.startswith("# "):
            raise ValueError("a notebook's first cell must be Markdown opening with its title ('# ...')")
        nb["cells"][:1] = [{"cell_type": "markdown", "metadata": {}, "source": source}
                           for source in (title, opening, rest.strip("\n")) if source]
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            # what a cell printed (progress, timings, library logs) is for whoever runs it, not for the reader
            cell["outputs"] = [o for o in cell.get("outputs", []) if o.get("output_type") != "stream"]
            tags = cell.setdefault("metadata", {}).setdefault("tags", [])
            if not any(t in HIDDEN for t in tags):
                tags.append("hide-input")
    return nb


def glued(nb: dict) -> dict[str, str]:
    """The values an executed notebook glued (MyST-NB's ``glue``, ``report.figures.glue``) as the book's text shows
    them, by name: a string without its quotes, a number as written; images and tables are left out."""
    import ast

    out = {}
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            data = output.get("data", {})
            text = data.get("application/papermill.record/text/plain")
            if name is None or text is None or "image/png" in data or "text/html" in data:
                continue
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text
            out[name] = value if isinstance(value, str) else str(value)
    return out


# ------------------------------------------------------------------------------------------------ MathJax, offline

MATHJAX_PATH = "mathjax/tex-chtml.js"
"""Sphinx's ``mathjax_path``: relative to the book's ``_static/``."""
MATHJAX_PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2", "ui", "a11y", "sre")
"""What the book copies of the package's MathJax, which is mostly builds for other inputs and outputs: the TeX-to-HTML
build, the TeX extensions a formula may load (``\\boldsymbol``, ...), its fonts, and what its menu loads on request."""


def mathjax_source() -> Path:
    """The MathJax folder of the installed ``sphinx-mathjax-offline`` package (a dependency of the project)."""
    import importlib.metadata

    dist = importlib.metadata.distribution("sphinx-mathjax-offline")
    return Path(dist.locate_file("sphinx-mathjax-offline/static/mathjax"))


def copy_mathjax(dest: Path) -> None:
    """Copy ``MATHJAX_PARTS`` of MathJax into ``dest`` (the book's ``_static/mathjax``)."""
    src = mathjax_source()
    for part in MATHJAX_PARTS:
        if (src / part).is_dir():
            shutil.copytree(src / part, dest / part, dirs_exist_ok=True)
        else:
            (dest / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / part, dest / part)


TABLE_CSS = ("diffeqformer-tables.css", ".cell_output table tbody th { overflow-wrap: anywhere; }\n")
"""A style sheet of the book's (name, text): a notebook's table breaks a long word of its row labels (an index such
as ``shakespeare_lastword``) where the table would otherwise be wider than the text column, cut off at its edge;
column headers and numbers stay whole."""


def setup(app):
    """Sphinx extension: MathJax from ``_static/mathjax`` of the book itself; ``TABLE_CSS`` on every page."""
    mathjax_source()  # a missing package fails the build at its start, not after every page

    def use_local(app, config):
        config.mathjax_path = MATHJAX_PATH

    def copy(app, exc):
        if exc is None and app.builder.format == "html":
            copy_mathjax(Path(app.outdir) / "_static" / "mathjax")
            (Path(app.outdir) / "_static" / TABLE_CSS[0]).write_text(TABLE_CSS[1])

    # MathJax on every page, not only on those with formulas of their own: the navigation shows the titles of
    # other pages (F3's has a formula), which stayed raw TeX on a page without one.
    app.set_html_assets_policy("always")
    app.add_css_file(TABLE_CSS[0])
    app.connect("config-inited", use_local)
    app.connect("build-finished", copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m diffeqformer.report.book",
                            description="Write _config.yml's repository.url into the Colab cell of every notebook in "
                                        "notebooks/ and tag that cell remove-cell.").parse_args(argv)
    changed = sync_colab_cells()
    print(f"{len(changed)} notebooks changed" + (": " + ", ".join(p.name for p in changed) if changed else ""))


if __name__ == "__main__":
    main()
