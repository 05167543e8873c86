"""diffeqformer.book: the book's MathJax comes from an installed package and is copied into the book."""

from __future__ import annotations

from diffeqformer import book


def test_mathjax_is_copied_from_the_installed_package(tmp_path):
    book.copy_mathjax(tmp_path)
    assert (tmp_path / "tex-chtml.js").stat().st_size > 1_000_000
    assert (tmp_path / book.MATHJAX_PATH.removeprefix("mathjax/")).exists()
    # what a page with formulas loads besides the script (measured in the browser check)
    fonts = tmp_path / "output" / "chtml" / "fonts" / "woff-v2"
    for font in ("MathJax_Zero", "MathJax_Main-Regular", "MathJax_Math-Italic", "MathJax_Size1-Regular"):
        assert (fonts / f"{font}.woff").exists(), font
    assert (tmp_path / "input" / "tex" / "extensions" / "boldsymbol.js").exists()  # autoloaded by \boldsymbol
