"""The sentences the book's pages show: headlines, labels and the wording of what an analysis found.

The analyses compute and return data (``diffeqformer.analysis``); the plots draw it (``diffeqformer.report.plots``);
this module words it, in one place, so that a page's prose and the Verdicts page never say a thing two ways. Each
function takes the data an analysis returned and returns text (Markdown where it is a sentence of a page).
"""

from __future__ import annotations

# ----------------------------------------------------------------------------------------------------------------------
# F2: eigenvalue spectra (analysis.spectra)


# ----------------------------------------------------------------------------------------------------------------------
# F3: trajectories (analysis.trajectories)


# ----------------------------------------------------------------------------------------------------------------------
# F5: Lyapunov exponents and attribution (analysis.lyapunov, analysis.attribution)


# ----------------------------------------------------------------------------------------------------------------------
# F7-F10: fine-tuning and the ablations (analysis.ablations)


# ----------------------------------------------------------------------------------------------------------------------
# F6, F11, x1: perplexity, downstream tasks, adaptive steps (analysis.perplexity, analysis.downstream, analysis.inference)
