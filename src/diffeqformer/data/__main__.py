"""``python -m diffeqformer.data prepare|summary`` (``diffeqformer.data.corpora.main``) and ``python -m
diffeqformer.data tasks`` (``diffeqformer.data.tasks.main``: F11's tasks from the held-out documents)."""

import sys

if sys.argv[1:2] == ["tasks"]:
    from .tasks import main

    main(sys.argv[2:])
else:
    from .corpora import main

    main()
