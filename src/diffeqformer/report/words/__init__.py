"""The sentences the book's pages show, one module per figure group: headlines, table cells and the wording of what
an analysis found. Each function takes the data an analysis returned and returns text (Markdown where it is a sentence
of a page). The analyses compute (``diffeqformer.analysis``), the plots draw (``diffeqformer.report.plots``), these
word it; a notebook imports its group's module alone, so that it re-executes only when what it shows changed.
"""
