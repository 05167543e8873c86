"""diffeqformer.analysis.schematic (F1): the weight curves agree with model.weights_at at the Euler points; the
diagram and the curves are drawn (report.plots.schematic)."""

import haliax as hax
import numpy as np
import pytest

from diffeqformer import DiffEqFormerConfig
from diffeqformer.analysis import schematic
from diffeqformer.report.plots import schematic as plots


def _model(getkey, **kw):
    config = DiffEqFormerConfig(max_seq_len=16, hidden_dim=16, num_layers=3, num_heads=2, mlp_scale=2,
                                time_embed_dim=4, sinusoidal_dim=4, **kw)
    return config.build(hax.Axis("vocab", 32), key=getkey())


@pytest.mark.parametrize("unit,kw", [("q_proj", {}), ("o_proj", {}), ("mlp_in", {}), ("mlp_out", {}),
                                     ("mlp_up", {"variant": "llama"}), ("k_proj", {"hypernet": "shared_mlp"})])
def test_curves_pass_through_the_layer_weights(getkey, unit, kw):
    model = _model(getkey, **kw)
    curves = schematic.weight_curves(model, unit, num_entries=3, num_times=101, seed=1)
    assert curves.values.shape == (len(curves.t), 3)
    np.testing.assert_allclose(curves.layer_t, [1 / 3, 2 / 3, 1.0], rtol=1e-6)
    at_layers = [int(np.flatnonzero(curves.t == t)[0]) for t in curves.layer_t]
    # the curve (h(t) times Proj's columns) against the materialised weights of the forward pass
    np.testing.assert_allclose(curves.values[at_layers], curves.layer_values, rtol=1e-5, atol=1e-6)
    assert schematic.variation_ratio(curves) >= 1.0 - 1e-6
    assert len(plots.weight_curves(curves, title=unit).axes[0].lines) == 2 * 3 + len(curves.layer_t)  # and the grid


def test_weight_shared_model_is_refused(getkey):
    with pytest.raises(ValueError, match="time_dependent"):
        schematic.weight_curves(_model(getkey, time_dependent=False))


def test_schematic_draws_both_panels():
    fig = plots.diagram(DiffEqFormerConfig(hidden_dim=64, num_heads=4, num_layers=6, time_embed_dim=8,
                                          sinusoidal_dim=16))
    assert len(fig.axes) == 2
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "D=64" in texts and "L=6" in texts and "d_t = 8" in texts.replace("d_t=", "d_t = ")
