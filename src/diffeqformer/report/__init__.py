"""What the book shows and how: ``figures`` (figures and tables saved with their provenance and scale, numbers glued
into the prose), ``book`` (the book as its readers see it), the pages of results the workflow writes, ``verdicts``
and ``accelerators``, and what a page shows of the analyses' data: ``words`` (its sentences) and ``plots`` (its
figures), one module per figure group.
"""

__all__ = ["accelerators", "book", "figures", "plots", "verdicts", "words"]
