"""What ``workflow/Snakefile`` reads and runs: Snakemake schedules the jobs; this package holds the presets as data
and the commands the jobs run.

- ``presets``: per preset, which notebooks run with which parameter values; a ``Run`` value stands for the run of a
  config file, which the workflow trains before the notebook and passes to it as its run directory.
- ``plan``: the preset checked (notebooks, parameters and their types, ``_toc.yml``, configs) and resolved into the
  token caches, trainings and notebook executions, as plain data the Snakefile turns into rules.
- ``jobs``: ``python -m diffeqformer.workflow.jobs tokens|train|notebook|book|publish``, what each job runs.
- ``build`` (the book job), ``pages`` (the pages it writes into the book, their results' words from
  ``diffeqformer.report``), ``edition`` (the GPU edition: pack on the GPU machine, import here).

Adding a notebook is one entry per preset in ``presets`` and its line in ``_toc.yml``::

    "f5_lyapunov": dict(run=Run("cpu/synthetic_diffeqformer"), ref_run=Run("cpu/diffeqformer")),
"""
