"""The book as its readers see it.

**Offline formulas.** As a Sphinx extension (``_config.yml`` lists it) this module points Sphinx's MathJax at a copy
inside the book (``_static/mathjax/tex-chtml.js``) instead of a CDN, and copies it there from the PyPI package
``sphinx-mathjax-offline`` (MathJax 3.2.2), which the project installs: the book typesets the same without internet.
"""

from __future__ import annotations

import shutil
from pathlib import Path

MATHJAX_PATH = "mathjax/tex-chtml.js"
"""Sphinx's ``mathjax_path``: relative to the book's ``_static/``."""
MATHJAX_PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2", "ui", "a11y", "sre")
"""What the book copies of the package's MathJax (24 MB, mostly combined builds for other inputs and outputs): the
TeX-to-HTML build (1.2 MB; a page loads it and four of its fonts), the TeX extensions it loads when a formula needs
one (``\\boldsymbol``, ...), its fonts, and what its menu loads on request: the accessibility components and their
speech rules (3.9 MB). 7 MB in all."""


def mathjax_source() -> Path:
    """The MathJax folder of the installed ``sphinx-mathjax-offline`` package."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("sphinx-mathjax-offline")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("the book's MathJax comes from the package sphinx-mathjax-offline, which is not "
                           "installed: `make setup` installs it (pip install sphinx-mathjax-offline)") from None
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


def setup(app):
    """Sphinx extension: MathJax from ``_static/mathjax`` of the book itself."""
    from sphinx.errors import ExtensionError

    try:
        mathjax_source()
    except RuntimeError as err:
        raise ExtensionError(str(err)) from None

    def use_local(app, config):
        config.mathjax_path = MATHJAX_PATH

    def copy(app, exc):
        if exc is None and app.builder.format == "html":
            copy_mathjax(Path(app.outdir) / "_static" / "mathjax")

    # MathJax on every page, not only on those with formulas of their own: the navigation shows the titles of
    # other pages (F3's has a formula), which stayed raw TeX on a page without one.
    app.set_html_assets_policy("always")
    app.connect("config-inited", use_local)
    app.connect("build-finished", copy)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
