"""``python -m diffeqformer.data prepare|summary``: see ``diffeqformer.data.corpora.main``."""

from .corpora import main

main()
