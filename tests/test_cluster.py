"""The cluster page's cost tables (``workflow.cost``), computed from the configs and the measurements. (The SLURM
profile's jobs and resources: ``test_workflow.py``'s dry run.)"""

from __future__ import annotations

import re

import pytest

from diffeqformer import config as configs
from diffeqformer import paths
from diffeqformer.workflow import cost


# ----------------------------------------------------------------------------------------------- the cost page


def test_gpt2_parameter_count_is_the_built_models():
    import equinox as eqx
    import jax.random as jrandom
    from haliax import Axis

    from diffeqformer.model.transformer import count_params

    model = configs.load_config(paths.CONFIG / "smoke" / "gpt2.yaml").model
    built = eqx.filter_eval_shape(model.build, Axis("vocab", 97), key=jrandom.PRNGKey(0))
    assert cost.parameters(model, 97) == count_params(built)


def test_the_paper_preset_costs_its_flops_at_the_measured_rate():
    rates = cost.measured_rates()
    assert rates and all("H100" in r.device for r in rates.values())
    rows = cost.trainings("paper", rates)
    small = next(t for t in rows if t.name == "paper-wt103-small-gpt2")
    config = configs.load_config(paths.CONFIG / "paper" / "wikitext103_small_gpt2.yaml")
    tokens = config.trainer.num_train_steps * config.trainer.train_batch_size * config.model.max_seq_len
    assert small.tokens == tokens and small.rate is rates[("baseline", 12, 768)]  # measured at that shape
    assert small.flops == pytest.approx(3 * config.model.flops_per_token(50257, 1024) * tokens)
    assert small.gpu_hours == pytest.approx(small.flops / rates[("baseline", 12, 768)].flops_per_s / 3600)
    large = next(t for t in rows if t.name == "paper-owt-large-gpt2")  # not measured: the largest measured baseline
    assert large.rate is rates[max((k for k in rates if k[0] == "baseline"), key=lambda k: k[1] * k[2] ** 2)]
    page = cost.cost_markdown("paper")
    total = sum(t.gpu_hours for t in rows)
    assert f"**{total:,.0f} GPU hours** in all ({len(rows)} trainings of the paper preset)" in page
    assert re.search(r"\| baseline 12 x 768 \| 124M \|", page)
