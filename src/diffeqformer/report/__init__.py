"""What the book shows and how: ``figures`` (figures and tables saved with their provenance and scale, numbers glued
into the prose) and ``book`` (the Sphinx extension that serves MathJax from the book; the notebooks' Colab cell).

The analyses draw with these; the workflow builds the book with them. ``python -m diffeqformer.report.book`` writes
``_config.yml``'s repository URL into every notebook's Colab cell.
"""

__all__ = ["book", "figures"]
