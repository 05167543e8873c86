"""What the book shows and how: ``figures`` (figures and tables saved with their provenance and scale, numbers glued
into the prose), ``book`` (the Sphinx extension that serves MathJax from the book; the notebooks' Colab cell), and
the pages of results the workflow writes into the book: ``verdicts`` (the headline claims' verdicts, Holm-adjusted)
and ``accelerators`` (the GPU measurements' tables, and a preset's GPU hours at their rates).

``words`` (the pages' sentences, one module per figure group) and ``plots`` (the figures, likewise) turn the
analyses' data into what a page shows; the workflow builds the book with all of them.
``python -m diffeqformer.report.book`` writes ``_config.yml``'s repository URL into every notebook's Colab cell.
"""

__all__ = ["accelerators", "book", "figures", "plots", "verdicts", "words"]
