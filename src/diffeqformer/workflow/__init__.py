"""What ``workflow/Snakefile`` reads and runs: the presets as data (``presets``), checked and resolved into jobs
(``plan``), the jobs' commands (``jobs``), the book job and the pages it writes (``pages``) and the GPU edition
(``edition``). Adding a notebook is one entry per preset in ``presets`` and its line in ``_toc.yml``."""
