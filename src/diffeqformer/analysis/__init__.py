"""The analyses of trained runs, one module per question of the paper, each importing only the layers below it
(model, data, train, runs, report), ``statistics``, ``multiplicity`` and ``claims``:

- ``statistics``: the verdict rule (a two-sided test at 5% over seeds or models) and a claim's four verdicts;
- ``multiplicity``: many tests at once (Holm's adjustment of the headline claims, the intersection-union test);
- ``claims``: the paper's headline claims, each with its one primary test, named before any number;
- ``schematic`` (F1), ``spectra`` (F2), ``trajectories`` (F3/F4), ``lyapunov`` (token-level Lyapunov exponents,
  F5), ``inference`` (ODE solvers at inference, x1), ``perplexity`` (F6), ``ablations`` (F7-F10), ``memory`` (a
  training step's measured time and peak memory; ``python -m diffeqformer.analysis.memory``), ``downstream`` (F11);
- ``attribution``: F5's attribution methods (attention, rollout, gradient x input, ``lyapunov``'s exponents) and
  their benchmark against the synthetic language's ground truth.
- ``model_trajectories``: F3's dynamics driven by a trained model's heads; ``clustering``: F3's metrics and tests.

Each module is imported on its own (``from diffeqformer.analysis import spectra``): this package imports none.
"""

__all__ = ["ablations", "attribution", "claims", "clustering", "downstream", "inference", "lyapunov", "memory",
           "model_trajectories", "multiplicity", "perplexity", "schematic", "spectra", "statistics", "trajectories"]
