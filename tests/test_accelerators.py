"""``report.accelerators``: the accelerator measurements' tables and the cluster page's cost tables, computed from
the configs and the measurement files. (The SLURM profile's jobs and resources: ``test_workflow.py``'s dry run.)"""

from __future__ import annotations

import json
import re

import pytest

from diffeqformer import config as configs
from diffeqformer import paths
from diffeqformer.report import accelerators as cost
from diffeqformer.workflow.plan import collect_runs
from diffeqformer.workflow.presets import preset


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
    rows = cost.trainings(collect_runs(list(preset("paper").values())), rates)
    small = next(t for t in rows if t.name == "paper-wt103-small-gpt2")
    config = configs.load_config(paths.CONFIG / "paper" / "wikitext103_small_gpt2.yaml")
    tokens = config.trainer.num_train_steps * config.trainer.train_batch_size * config.model.max_seq_len
    assert small.tokens == tokens and small.rate is rates[("baseline", 12, 768)]  # measured at that shape
    assert small.flops == pytest.approx(3 * config.model.flops_per_token(50257, 1024) * tokens)
    assert small.gpu_hours == pytest.approx(small.flops / rates[("baseline", 12, 768)].flops_per_s / 3600)
    large = next(t for t in rows if t.name == "paper-owt-large-gpt2")  # not measured: the largest measured baseline
    assert large.rate is rates[max((k for k in rates if k[0] == "baseline"), key=lambda k: k[1] * k[2] ** 2)]
    page = cost.cost_markdown(collect_runs(list(preset("paper").values())), "paper")
    total = sum(t.gpu_hours for t in rows)
    assert f"**{total:,.0f} GPU hours** in all ({len(rows)} trainings of the paper preset)" in page
    assert re.search(r"\| baseline 12 x 768 \| 124M \|", page)


# ------------------------------------------------------------------------------------------ the accelerator page


def _measured(d_t, params, tps, peak, mfu=None, model="DiffEqFormerConfig"):
    return {"model": model, "layers": 12, "hidden": 768, "seq": 1024, "time_embed_dim": d_t, "batch": 16,
            "params": params, "tokens_per_second": tps, "peak_memory_gib": peak, "mfu": mfu}


def test_gpu_page_reads_its_numbers_from_the_measurement_files(tmp_path):
    """The GPU table and its sentence come from benchmarks/gpu/measure.py's JSON: ratio, MFU and the d_t growth are
    the file's (here made up), and no file gives a sentence saying so, not an empty table."""
    assert "No accelerator measurements" in cost.gpu_markdown(tmp_path)
    result = {"date": "2026-01-02", "device": "Some GPU", "jax": "0.11.2", "peak_tflops": 500.0, "pairs": [
        {"pair": "small", "ratio": 0.9, "diffeqformer": _measured(20, 2e8, 90_000, 4.0, 0.25),
         "gpt2": _measured(None, 1e8, 100_000, 3.0, 0.30, "Gpt2Config")}],
        "time_embed_dim": [_measured(80, 8e8, 81_000, 10.0, 0.2)]}
    (tmp_path / "gpu-some-2026-01-02.json").write_text(json.dumps(result))
    page = cost.gpu_markdown(tmp_path)
    assert "**Some GPU**, 2026-01-02, JAX 0.11.2, batches of 16 sequences (small: 12 x 768, seq 1024)" in page
    assert "500 TFLOP/s" in page
    assert "| small | DiffEqFormer | 20 | 200M | 90,000 | 0.900 | 25.0% | 4.00 |" in page
    assert "| small | GPT-2 |  | 100M | 100,000 |  | 30.0% | 3.00 |" in page
    assert ("DiffEqFormer trains at 0.90 times GPT-2's tokens/s, the models at 25%-30% model FLOP utilisation. "
            "From d_t = 20 to 80 the parameters grow 4.0 times, the peak memory 2.5 times, and tokens/s change by "
            "-10%.") in page
    # the committed measurements render
    assert "TFLOP/s" in cost.gpu_markdown()


def test_gpu_page_renders_a_ladder_of_levers(tmp_path):
    """A ``measure.py --ladder`` file becomes one table: each row's levers, both models' numbers, the ratio, the change
    from the pair's first row; a failed row shows the last line of its error."""
    def pair(tps_ours, tps_gpt, batch=16):
        ours = _measured(20, 2e8, tps_ours, 4.0, 0.25) | {"vocab": 50257, "batch": batch}
        gpt = _measured(None, 1e8, tps_gpt, 3.0, 0.30, "Gpt2Config") | {"vocab": 50257, "batch": batch}
        return {"diffeqformer": ours, "gpt2": gpt, "ratio": tps_ours / tps_gpt}

    result = {"date": "2026-01-02", "device": "Some GPU", "jax": "0.11.2", "peak_tflops": 500.0, "pairs": [],
              "ladder": [{"pair": "small", "row": "levanter-default", **pair(100_000, 100_000)},
                         {"pair": "small", "row": "+cudnn-attention", "error": "Traceback\nValueError: no cuDNN"},
                         {"pair": "small", "row": "+batch-32", **pair(150_000, 120_000, 32)}]}
    (tmp_path / "gpu-some-2026-01-02-ladder.json").write_text(json.dumps(result))
    page = cost.gpu_markdown(tmp_path)
    assert "the speed levers one on top of another" in page and "500 TFLOP/s" in page
    assert ("| small | levanter-default | 16 | 50,257 | 100,000 | 25.0% | 4.0 | 100,000 | 30.0% | 3.0 | 1.000 |  |"
            in page)
    assert "| small | +cudnn-attention | | | failed: ValueError: no cuDNN |" in page
    assert ("| small | +batch-32 | 32 | 50,257 | 150,000 | 25.0% | 4.0 | 120,000 | 30.0% | 3.0 | 1.250 "
            "| +50% / +20% |") in page
