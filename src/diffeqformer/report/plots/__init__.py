"""The book's figures, one module per figure group: each function takes the data an analysis returned
(``diffeqformer.analysis``) and returns a matplotlib Figure, touching no pyplot state; saving and captions are
``diffeqformer.report.figures``'."""
