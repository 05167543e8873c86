"""``python -m diffeqformer.pipeline``."""

from .build import main

main()
