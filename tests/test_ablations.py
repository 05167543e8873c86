"""F7-F10 tables, sentences and figures (diffeqformer.analysis.ablations, report.words, report.plots.ablations) on
hand-written run directories, and the measurement of a training step's time and memory (analysis.memory) on a
smoke-size model."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from smoke_pipeline import smoke_book  # noqa: F401 (session fixture)

from diffeqformer import paths
from diffeqformer.analysis import ablations, memory, statistics
from diffeqformer.report.words import ablations as words
from diffeqformer.report.words import statistics as wording
from diffeqformer.report.plots import ablations as plots


def fake_run(root, name, *, model=None, data=None, optimizer=None, losses, complete=None, pretrain=None,
             finetune=None):
    """A finished run directory as diffeqformer.train / diffeqformer.finetune write it: config.yaml,
    metrics.jsonl (eval/loss per step), complete.json; a fine-tuning also gets pretrain_config.yaml."""
    run = root / name
    run.mkdir(parents=True)
    data = {"dataset": "shakespeare", "domain": "all", "vocab_size": 4096, **(data or {})}
    trainer = {"num_train_steps": max(losses), "train_batch_size": 4}
    if finetune is None:
        config = {"name": name, "data": data, "model": model, "trainer": trainer,
                  "optimizer": {"beta2": 0.999, **(optimizer or {})}}
    else:
        config = {"name": name, "pretrain": {"config": pretrain["file"]}, "data": data, "trainer": trainer,
                  **finetune}
        (run / "pretrain_config.yaml").write_text(yaml.safe_dump(pretrain["config"]))
    (run / "config.yaml").write_text("# config_hash: x\n" + yaml.safe_dump(config))
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "time": 0.0, "eval/loss": loss}) + "\n" for step, loss in losses.items()))
    last = losses[max(losses)]
    record = {"name": name, "config_hash": f"hash-{name}", "steps": max(losses), "final_eval_loss": last,
              "final_eval_perplexity": math.exp(last), "tokens_per_second": 1000.0, "wall_time_s": 10.0,
              "vocab_size": 4096, **(complete or {})}
    (run / "complete.json").write_text(json.dumps(record))
    return str(run)


ODE = {"type": "diffeqformer", "num_layers": 18, "hidden_dim": 32, "num_heads": 2, "max_seq_len": 64,
       "time_embed_dim": 4}
GPT = {"type": "gpt2", "num_layers": 24, "hidden_dim": 32, "num_heads": 2, "max_seq_len": 64}


@pytest.fixture
def grid(tmp_path):
    """One direction (plays -> prose) of a Fig. 5 grid: two pretrainings, LoRA fine-tunings of the ODE at N = 9
    and 18 and of the GPT-2, and the GPT-2 from scratch on prose."""
    ode_pre = {"name": "pre-ode", "data": {"domain": "plays"}, "model": ODE}
    gpt_pre = {"name": "pre-gpt", "data": {"domain": "plays"}, "model": GPT}
    runs = {
        "pre-ode": fake_run(tmp_path, "pre-ode", model=ODE, data={"domain": "plays"}, losses={0: 8.0, 10: 6.0}),
        "pre-gpt": fake_run(tmp_path, "pre-gpt", model=GPT, data={"domain": "plays"}, losses={0: 8.0, 10: 6.1}),
    }
    for n, final in [(9, 5.0), (18, 5.2)]:
        runs[f"ode-{n}"] = fake_run(
            tmp_path, f"ode-{n}", data={"domain": "prose"}, losses={-1: 6.5, 0: 6.5, 5: 5.6, 10: final},
            pretrain={"file": "config/x/pre_ode.yaml", "config": ode_pre},
            finetune={"steps": n, "method": "lora"},
            complete={"euler_steps": n, "method": "lora", "trainable_params": 100 * n, "total_params": 10_000,
                      "pretrain_config_hash": "hash-pre-ode"})
    runs["gpt-ft"] = fake_run(
        tmp_path, "gpt-ft", data={"domain": "prose"}, losses={-1: 6.6, 0: 6.6, 10: 5.5},
        pretrain={"file": "config/x/pre_gpt.yaml", "config": gpt_pre}, finetune={"steps": None, "method": "lora"},
        complete={"euler_steps": None, "method": "lora", "trainable_params": 2400, "total_params": 9_000,
                  "pretrain_config_hash": "hash-pre-gpt"})
    runs["scratch"] = fake_run(tmp_path, "scratch", model=GPT, data={"domain": "prose"}, losses={0: 8.0, 10: 7.0},
                               complete={"trainable_params": 9_000, "total_params": 9_000})
    return runs


def test_finetune_table_rows_and_values(grid):
    table = ablations.finetune_table(grid)
    # the pretrainings are left out; the from-scratch GPT-2 is the last row of its direction and method
    assert list(table.model) == ["DiffEqFormer N=9", "DiffEqFormer N=18", "GPT-2 (24 layers)",
                                 "GPT-2 (24 layers) from scratch"]
    assert set(table.direction) == {"plays -> prose"} and set(table.method) == {"lora"}
    row = table.set_index("model").loc["DiffEqFormer N=9"]
    assert row["final ppl"] == pytest.approx(math.exp(5.0)) and row["ppl before"] == pytest.approx(math.exp(6.5))
    assert row["best ppl"] == pytest.approx(math.exp(5.0)) and row["trainable params"] == 900
    assert math.isnan(table.set_index("model").loc["GPT-2 (24 layers) from scratch", "ppl before"])


def test_finetune_verdicts_of_one_seed_are_untested(grid):
    table = ablations.finetune_table(grid)
    verdicts = ablations.finetune_verdicts(table)
    # one pretraining seed: nothing to judge the claims by; no full fine-tuning: that claim is not even asked
    assert [v.word for v in verdicts.values()] == [statistics.UNTESTED] * 3
    assert "full fine-tuning" in verdicts["f7_full"].note
    # every N against the GPT-2, not the best of them, each as exploration
    secondary = words.finetune_secondary(ablations.finetune_secondary(table))
    assert list(secondary.N) == [9, 18] and list(secondary["exploratory result"]) == [statistics.UNTESTED] * 2
    assert secondary["effect (95% CI)"].iloc[0] == f"{100 * math.expm1(5.0 - 5.5):+.1f}%"
    # the overfitting of each fine-tuning: its final perplexity above its best
    over = table.set_index("model")["final - best"]
    assert over["DiffEqFormer N=9"] == 0 and over["GPT-2 (24 layers)"] == 0


def test_plot_finetune_draws_a_line_per_setting(grid):
    import matplotlib

    matplotlib.use("Agg")
    table = ablations.finetune_table(grid)  # one seed a setting: sd is NaN
    fig = plots.finetune(table)
    lines = [line.get_label() for ax in fig.axes for line in ax.get_lines()]
    assert lines == list(table.model)
    markers = [line.get_marker() for line in fig.axes[0].get_lines()]
    assert len(set(markers)) == len(markers)  # lines that coincide stay told apart
    differences = plots.finetune_differences(table)
    labels = [line.get_label() for line in differences.axes[0].get_lines()]
    assert labels == ["GPT-2 (24 layers)", "DiffEqFormer N=9", "DiffEqFormer N=18"]
    assert differences.axes[0].get_lines()[1].get_ydata()[-1] == pytest.approx(100 * math.expm1(5.0 - 5.5))


def test_finetune_table_aggregates_seeds_and_the_verdicts_pair_the_pretrainings(tmp_path):
    runs = {}
    # pretraining seed k of both models, each fine-tuned once: the ODE ends 0.09-0.12 nats lower in every seed
    for k, (ode, gpt) in enumerate([(5.00, 5.10), (5.20, 5.32), (4.90, 4.99)]):
        suffix = f"-seed{k}" if k else ""
        ode_pre = {"name": f"pre-ode{suffix}", "data": {"domain": "plays"}, "model": ODE, "trainer": {"seed": k}}
        gpt_pre = {"name": f"pre-gpt{suffix}", "data": {"domain": "plays"}, "model": GPT, "trainer": {"seed": k}}
        for method, shift in (("lora", 0.0), ("full", 0.105)):
            runs[f"ode-{method}{suffix}"] = fake_run(
                tmp_path, f"ode-{method}{suffix}", data={"domain": "prose"},
                losses={-1: 6.5, 0: 6.5, 5: ode + shift - 0.05, 10: ode + shift},
                pretrain={"file": "config/x/pre_ode.yaml", "config": ode_pre},
                finetune={"steps": 9, "method": method},
                complete={"euler_steps": 9, "method": method, "trainable_params": 900, "total_params": 10_000,
                          "pretrain_config_hash": f"hash-pre-ode{suffix}"})
            runs[f"gpt-{method}{suffix}"] = fake_run(
                tmp_path, f"gpt-{method}{suffix}", data={"domain": "prose"}, losses={-1: 6.6, 0: 6.6, 10: gpt},
                pretrain={"file": "config/x/pre_gpt.yaml", "config": gpt_pre},
                finetune={"steps": None, "method": method},
                complete={"euler_steps": None, "method": method, "trainable_params": 2400, "total_params": 9_000,
                          "pretrain_config_hash": f"hash-pre-gpt{suffix}"})
    table = ablations.finetune_table(runs)
    lora = table[table.method == "lora"]
    assert list(lora.model) == ["DiffEqFormer N=9", "GPT-2 (24 layers)"] and list(lora.seeds) == [3, 3]
    row = lora.set_index("model").loc["DiffEqFormer N=9"]
    assert row["pretrain seeds"] == (0, 1, 2) and row.losses == pytest.approx((5.0, 5.2, 4.9))
    assert row["final ppl"] == pytest.approx(sum(math.exp(v) for v in (5.0, 5.2, 4.9)) / 3)
    # each seed's best was at step 5, 0.05 nats below its final
    over = sum(math.exp(v) - math.exp(v - 0.05) for v in (5.0, 5.2, 4.9)) / 3
    assert row["final - best"] == pytest.approx(over) and len(row.runs) == 3
    assert row.rises == pytest.approx((0.05, 0.05, 0.05))
    verdicts = ablations.finetune_verdicts(table)
    per_seed = ablations.finetune_per_seed(table, "lora")
    assert per_seed == pytest.approx([-0.10, -0.12, -0.09])
    assert verdicts["f7_lora"].word == statistics.REPRODUCED and verdicts["f7_lora"].n == 3
    assert verdicts["f7_lora"].test == statistics.ONE_SAMPLE
    # under full fine-tuning the ODE ends within 1.5% of GPT-2 in every seed: equivalent within the 5% margin by the
    # two one-sided tests; the overfitting claim needs two N on the target standing for WikiText-103
    assert ablations.finetune_per_seed(table, "full") == pytest.approx([0.005, -0.015, 0.015])
    assert verdicts["f7_full"].word == statistics.REPRODUCED and verdicts["f7_full"].p < 0.05
    assert verdicts["f7_overfit"].word == statistics.UNTESTED
    # the curve of a setting is the mean over its seeds
    curve = ablations.mean_curve(row.runs)
    assert list(curve.step) == [0, 5, 10]
    assert curve.eval_loss.iloc[-1] == pytest.approx((5.0 + 5.2 + 4.9) / 3)


def test_finetune_table_needs_a_finetuning(grid):
    with pytest.raises(ValueError, match="no fine-tuning run"):
        ablations.finetune_table([grid["pre-ode"], grid["scratch"]])
    with pytest.raises(FileNotFoundError, match="no finished run"):
        ablations.describe(grid["pre-ode"] + "-missing")


def test_eval_curve_shows_the_model_before_finetuning_at_step_0(grid):
    curve = ablations.eval_curve(grid["ode-9"])
    assert list(curve.step) == [0, 5, 10] and curve.perplexity.iloc[0] == pytest.approx(math.exp(6.5))


def seed_runs(root, name, finals, **kwargs):
    """Finished runs of one setting, one per final validation loss (its seeds)."""
    return [fake_run(root, f"{name}-s{k}", losses={0: 8.0, 10: loss}, **kwargs) for k, loss in enumerate(finals)]


def test_beta2_table_and_interaction(tmp_path):
    """Three seeds per setting: the table holds the mean over seeds, the change against beta2 = 0.999 (a ratio from
    the seed-matched log differences) and whether it is significant; the claim (a crossover) is judged by the
    interaction, seed by seed."""
    runs = {
        "ours": [seed_runs(tmp_path, "o1", [6.00, 6.01, 5.99], model=ODE),
                 seed_runs(tmp_path, "o2", [5.90, 5.92, 5.88], model=ODE, optimizer={"beta2": 0.95})],
        "gpt": [seed_runs(tmp_path, "g1", [6.00, 6.01, 5.99], model=GPT),
                seed_runs(tmp_path, "g2", [6.20, 6.21, 6.20], model=GPT, optimizer={"beta2": 0.95})],
    }
    table = ablations.beta2_table(runs)
    assert list(table.beta2) == [0.95, 0.999, 0.95, 0.999] and set(table.seeds) == {3}
    assert table.loc[0, "vs 0.999 %"] == pytest.approx(100 * math.expm1(-0.10))
    assert math.isnan(table.loc[1, "vs 0.999 %"])
    assert list(table.verdict) == [statistics.SIGNIFICANT, "", statistics.SIGNIFICANT, ""]
    interaction = ablations.beta2_interaction(table)
    assert interaction.test == statistics.ONE_SAMPLE and interaction.a.values == pytest.approx((-0.30, -0.29, -0.32))
    assert ablations.beta2_verdicts(table)["f8_beta2"].word == statistics.REPRODUCED
    headline = words.beta2_headline(table)
    assert f"(the lower beta2: {100 * math.expm1(-0.10):+.1f}% (95% CI " in headline["ours"]
    fig = plots.beta2(table)  # a panel per model, a line per beta2 (the mean over its seeds)
    assert [ax.get_title() for ax in fig.axes] == ["DiffEqFormer (18 steps)", "GPT-2 (24 layers)"]
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["beta2 = 0.95 (3 seeds)", "beta2 = 0.999 (3 seeds)"]
    assert lines[0].get_ydata()[-1] == pytest.approx(sum(math.exp(v) for v in (5.90, 5.92, 5.88)) / 3)
    # the lower beta2 helps GPT-2 more than DiffEqFormer: the claim's interaction the other way
    runs["gpt"][1] = seed_runs(tmp_path, "g3", [5.80, 5.81, 5.79], model=GPT, optimizer={"beta2": 0.95})
    assert ablations.beta2_verdicts(ablations.beta2_table(runs))["f8_beta2"].word == statistics.CONTRADICTED
    # the same directions, but the seed-matched differences spread too much: inconclusive, not refuted
    runs["gpt"][1] = seed_runs(tmp_path, "g4", [6.30, 5.90, 6.40], model=GPT, optimizer={"beta2": 0.95})
    assert ablations.beta2_verdicts(ablations.beta2_table(runs))["f8_beta2"].word == statistics.INCONCLUSIVE


def test_one_seed_reproduces_nothing(tmp_path):
    runs = {"ours": [fake_run(tmp_path, "o1", model=ODE, losses={0: 8.0, 10: 6.0}),
                     fake_run(tmp_path, "o2", model=ODE, optimizer={"beta2": 0.95}, losses={0: 8.0, 10: 5.9})],
            "gpt": [fake_run(tmp_path, "g1", model=GPT, losses={0: 8.0, 10: 6.0}),
                    fake_run(tmp_path, "g2", model=GPT, optimizer={"beta2": 0.95}, losses={0: 8.0, 10: 6.2})]}
    table = ablations.beta2_table(runs)
    assert list(table.verdict) == ["untested: 1 seed", "", "untested: 1 seed", ""]
    assert ablations.beta2_verdicts(table)["f8_beta2"].word == statistics.UNTESTED


def test_time_embedding_table_and_headline(tmp_path):
    runs = [seed_runs(tmp_path, f"dt{d}", losses, model={**ODE, "time_embed_dim": d},
                      complete={"tokens_per_second": tps})
            for d, losses, tps in [(8, [5.80, 5.82, 5.79], 900.0), (2, [6.00, 6.01, 5.99], 1000.0)]]
    measured = [{"run": runs[0][0], "tokens_per_second": 1800.0, "training_mib": 150.0, "device_peak_mib": None,
                 "xla_planned_mib": 90.0},
                {"run": runs[1][0], "tokens_per_second": 2000.0, "training_mib": 100.0, "device_peak_mib": None,
                 "xla_planned_mib": 60.0}]
    table = ablations.time_embedding_table(runs, measured)
    assert list(table.d_t) == [2, 8] and list(table["training MiB"]) == [100.0, 150.0]
    assert "device peak MiB" not in table  # no accelerator: the column says nothing
    assert table.params.iloc[1] > table.params.iloc[0]  # counted on the model built from each config
    growth = ablations.time_embedding_memory(table, batch=16)
    verdicts = ablations.time_embedding_verdicts(table, growth, words.memory_note(growth))
    text = words.time_embedding_headline(table, verdicts)
    assert text["range"] == "d_t = 2 to 8" and text["throughput"] == "x0.90" and text["best_dt"] == "8"
    assert text["ppl"].endswith("(3 seeds)")
    ratio = table.params.iloc[1] / table.params.iloc[0]
    assert text["params"].endswith(f"(x{ratio:.2f})") and text["memory"].startswith("x1.50")  # XLA's plan: 60 -> 90
    # memory is judged per added parameter (on XLA's plan: there is no device peak), not by the ratio of the ends
    per_parameter = 30 * 2**20 / (table.params.iloc[1] - table.params.iloc[0])
    gpu = memory.memory_growth([100e6, 400e6], [2 * 2**30 + 4 * p for p in (100e6, 400e6)], "a GPU")
    rows = words.memory_table(table, gpu, batch=16)
    assert list(rows.index) == ["this preset: XLA's plan of the step", "this preset: resident memory above the "
                                "runtime's", "GPU sweep"], list(rows.index)
    plan, rss = rows.iloc[0], rows.iloc[1]
    assert plan["B per added parameter"] == pytest.approx(per_parameter) and plan["memory x"] == pytest.approx(1.5)
    assert plan["share of their growth"] == pytest.approx(0.5 / (ratio - 1)) and plan["parameters x"] == ratio
    assert "XLA's plan of the step at batch 16" in plan["measured as"]
    assert rss["B per added parameter"] == pytest.approx(50 * 2**20 / (table.params.iloc[1] - table.params.iloc[0]))
    assert rows.loc["GPU sweep", "Fig. 16's claim"] == "holds" and rows.loc["GPU sweep", "not growing"] == "2.00 GiB"
    # judged as the paper words it: the memory's growth (x1.50) over the parameters' growth
    assert verdicts["f9_memory"].word == (statistics.REPRODUCED if 0.5 / (ratio - 1) < 0.5 else statistics.CONTRADICTED)
    assert verdicts["f9_memory"].effect == pytest.approx(0.5 / (ratio - 1)) and math.isnan(verdicts["f9_memory"].p)
    assert f"costs {per_parameter:.1f} B" in verdicts["f9_memory"].note  # the stricter reading, exploratory
    assert table[f"{memory.PARAMETER_BYTES} B x params MiB"].tolist() == pytest.approx(
        (table.params * 16 / 2**20).tolist())
    # two d_t, matched seeds: the slope per doubling is the paired difference of log-perplexities over
    # log2(8 / 2) = 2 doublings
    slope = ablations.time_embedding_trend(table)
    assert slope.slope == pytest.approx((sum((5.80, 5.82, 5.79)) - sum((6.00, 6.01, 5.99))) / 3 / 2)
    assert slope.df == 2 and verdicts["f9_dt"].word == statistics.REPRODUCED
    assert text["trend"] == wording.verdict(verdicts["f9_dt"]) and "% per doubling" in text["trend"]
    noisy = table.assign(losses=[(6.00, 5.95, 6.05), (5.99, 6.05, 5.94)])
    assert ablations.time_embedding_verdicts(noisy)["f9_dt"].word == statistics.INCONCLUSIVE
    worse = table.assign(losses=[(6.00, 6.01, 5.99), (6.10, 6.12, 6.09)])
    assert ablations.time_embedding_verdicts(worse)["f9_dt"].word == statistics.CONTRADICTED


def _dt_table(d_ts, losses):
    import pandas as pd

    return pd.DataFrame({"d_t": d_ts, "losses": [tuple(f) for f in losses],
                         "finals": [tuple(math.exp(v) for v in f) for f in losses],
                         "final ppl": [sum(math.exp(v) for v in f) / len(f) for f in losses],
                         "params": [1.0] * len(d_ts), "tokens/s": [1.0] * len(d_ts)})


def test_time_embedding_trend_over_every_d_t():
    """The trend uses every d_t, not the two ends: a known slope per doubling with seed offsets is found; a curve
    that falls from the smallest to the largest d_t but not along the way is inconclusive; one seed of two d_t is
    untested."""
    d_ts = [2, 4, 8, 16]
    wobble = [[0.001, -0.001, 0.0], [-0.001, 0.0, 0.001], [0.0, 0.001, -0.001], [0.001, 0.0, -0.001]]
    known = _dt_table(d_ts, [[6.0 - 0.03 * k + 0.1 * s + wobble[k][s] for s in range(3)] for k in range(4)])
    slope = ablations.time_embedding_trend(known)
    assert slope.slope == pytest.approx(-0.03, abs=1e-3) and slope.significant and (slope.n, slope.groups) == (12, 3)
    assert ablations.time_embedding_verdicts(known)["f9_dt"].word == statistics.REPRODUCED
    # ends 0.01 apart (significant by the paired test of the ends alone), the middle settings up and down: no trend
    bumpy = _dt_table(d_ts, [[6.00, 6.01, 5.99], [6.04, 5.96, 6.06], [5.94, 6.06, 5.97], [5.99, 6.00, 5.98]])
    ends = statistics.compare_seeds(bumpy.losses.iloc[-1], bumpy.losses.iloc[0])
    assert ends.test == statistics.EXACT_SIGNS and ends.difference < 0  # the same 0.01 in every seed
    assert ablations.time_embedding_trend(bumpy).verdict == statistics.INCONCLUSIVE
    assert ablations.time_embedding_verdicts(bumpy)["f9_dt"].word == statistics.INCONCLUSIVE
    one = _dt_table([2, 8], [[6.0], [5.9]])
    assert ablations.time_embedding_trend(one).verdict == "untested: 2 values in 1 seed"
    assert ablations.time_embedding_verdicts(one)["f9_dt"].word == statistics.UNTESTED
    # unequal seed counts: seeds are not matched, one intercept
    assert ablations.time_embedding_trend(_dt_table([2, 8], [[6.0, 6.1], [5.9]])).test == "t-test of the slope"


def test_memory_growth_is_judged_as_the_paper_words_it_and_per_added_parameter():
    """A known line: 2 GiB fixed and b bytes per parameter. The paper's claim, memory growing less than half as much
    as the parameters, holds for the fixed part's sake; the stricter reading, exploratory: 16 B a parameter is no
    saving, 4 B would be one."""
    params = [100e6, 400e6, 1000e6]
    for b, saving in [(16.0, False), (14.0, False), (4.0, True)]:
        g = memory.memory_growth(params[::-1], [2 * 2**30 + b * p for p in params[::-1]], "a line")
        assert g.params == tuple(params) and g.per_parameter == pytest.approx(b) and g.fixed == pytest.approx(2**31)
        assert g.memory_ratio < g.params_ratio  # the ratio form holds in every case
        assert g.far_less is saving
        relative = (g.memory_ratio - 1) / (g.params_ratio - 1)
        assert g.growth_ratio == pytest.approx(relative) and g.grows_far_less is (relative < 0.5)
        explained = words.memory_explanation(g)
        assert f"costs {b:.1f} B against the 16 B" in explained and "2.00 GiB of the memory does not grow" in explained
    with pytest.raises(ValueError, match="two or more parameter counts"):
        memory.memory_growth([5, 5], [1, 2], "x")


def test_gpu_memory_growth_reads_a_measurement_file(tmp_path):
    def entry(d_t, params, gib):
        return {"time_embed_dim": d_t, "params": params, "peak_memory_gib": gib, "batch": 16, "layers": 12,
                "hidden": 768, "seq": 1024, "policy": "p=f32,c=bfloat16"}

    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"device": "Some GPU", "pairs": [{"diffeqformer": entry(20, 2e8, 5.0)}],
                                "time_embed_dim": [entry(144, 1e9, 5.0 + 14 * 8e8 / 2**30),
                                                   entry(48, 4e8, 5.0 + 14 * 2e8 / 2**30)]}))
    growth, table = memory.gpu_memory_growth(path)
    assert growth.per_parameter == pytest.approx(14.0) and list(table.d_t) == [20, 48, 144]
    assert growth.source.startswith("Some GPU, allocator peak at batch 16, 12 x 768")
    assert table["16 B x params GiB"].tolist() == pytest.approx([16 * p / 2**30 for p in (2e8, 4e8, 1e9)])
    path.write_text(json.dumps({"device": "Some GPU", "pairs": [{"diffeqformer": entry(20, 2e8, 5.0)}]}))
    with pytest.raises(ValueError, match="fewer than two d_t"):
        memory.gpu_memory_growth(path)


def test_plot_memory_draws_a_panel_per_sweep():
    g = memory.memory_growth([1e6, 2e6, 4e6], [40e6 + 16 * p for p in (1e6, 2e6, 4e6)], "a line")
    fig = plots.memory({"here": g, "there": g})
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 4  # points, fit, 16 B a parameter, fixed part


def test_hypernetwork_headline(tmp_path):
    runs = [seed_runs(tmp_path, "pw", [6.00, 6.01, 5.99], model={**ODE, "hypernet": "per_weight"}),
            seed_runs(tmp_path, "sh", [5.90, 5.92, 5.88], model={**ODE, "hypernet": "shared_mlp"})]
    table = ablations.ablation_table(runs, {"hypernet": "model.hypernet"})
    assert "run" not in ablations.shown(table) and "losses" not in ablations.shown(table)
    verdict = ablations.hypernetwork_verdicts(table)["f10_hypernet"]
    assert verdict.word == statistics.CONTRADICTED and verdict.effect == pytest.approx(100 * math.expm1(0.10))
    assert words.hypernetwork_headline(table)["comparison"].startswith("per-weight MLPs ")
    better = ablations.ablation_table(runs[::-1], {"hypernet": "model.hypernet"})
    better = better.assign(hypernet=["per_weight", "shared_mlp"])
    assert ablations.hypernetwork_verdicts(better)["f10_hypernet"].word == statistics.REPRODUCED
    assert ablations.hypernetwork_verdicts(table.iloc[:1])["f10_hypernet"].word == statistics.UNTESTED


@pytest.mark.pipeline
def test_f9_measures_each_runs_training_step_in_a_process_of_its_own(smoke_book):  # noqa: F811
    """F9's measurement in the smoke pipeline (``memory.measure_training_steps`` on its two runs of different d_t,
    batch 4, 3 steps; the notebook saves what it returned as ``f9_measured.csv``): compiled side by side, timed one after the
    other, each result its own run's; memory measured and XLA's plan of the step consistent; the measuring process
    loaded the step its compiling process compiled."""
    import pandas as pd

    measured = smoke_book.home / "figures" / "f9_measured.csv"
    assert measured.exists(), smoke_book.first.explain()
    rows = pd.read_csv(measured, index_col=0).to_dict("records")
    parameters = json.loads(measured.with_suffix(".json").read_text())["parameters"]
    assert [r["run"] for r in rows] == [statistics.as_list(run)[0] for run in parameters["runs"]]
    result, other = sorted(rows, key=lambda r: r["params"])  # the smaller model first
    first, second = rows
    assert first["timed_from"] < first["timed_to"] < second["timed_from"] < second["timed_to"]
    assert other["xla_planned_mib"] > result["xla_planned_mib"]  # the larger model's parameters
    seq = yaml.safe_load((paths.CONFIG / "smoke" / "diffeqformer.yaml").read_text())["model"]["max_seq_len"]
    for r in rows:
        assert r["backend"] == "cpu" and r["batch"] == 4 and r["steps"] == 3
        assert r["tokens_per_second"] == pytest.approx(4 * seq / r["step_s"]) and r["step_s"] > 0
        assert r["rss_peak_mib"] >= r["rss_baseline_mib"] > 0
        assert r["training_mib"] == pytest.approx(r["rss_peak_mib"] - r["rss_baseline_mib"])
        assert r["training_mib"] > 0 and r["xla_planned_mib"] > 0 and math.isnan(r["device_peak_mib"])
        # the step donates its parameters and Adam's state, as training does: every argument but the tokens
        # (4 x seq int32) is donated and written into
        assert (r["xla_arguments_mib"] - r["xla_aliased_mib"]) * 2**20 == pytest.approx(4 * seq * 4, abs=1e-6)
        assert r["xla_planned_mib"] == pytest.approx(r["xla_arguments_mib"] + r["xla_outputs_mib"]
                                                     - r["xla_aliased_mib"] + r["xla_temporaries_mib"])
        # the measuring process loaded the step the compiling one compiled (so its peak is the training's, not
        # the compiler's); how much faster that is, is wall-clock: benchmarks/step_measure.py prints it
        assert r["step_from_cache"] is True
        assert r["compile_mib"] > 0 and r["compile_s"] > 0 and r["first_compile_s"] > 0
    # what an added parameter holds among the arguments: itself and Adam's two moments, float32, 12 bytes
    added = (other["xla_arguments_mib"] - result["xla_arguments_mib"]) * 2**20 / (other["params"] - result["params"])
    assert added == pytest.approx(12.0, abs=1e-6) and other["params"] > result["params"] > 0


_TWICE = """
import json, os, sys
import jax
import diffeqformer
os.environ["XLA_FLAGS"] = diffeqformer.ONEDNN_CACHEABLE_FLAG  # what F9's measuring processes add (memory._measure)
jax.config.update("jax_compilation_cache_dir", sys.argv[2])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from diffeqformer.analysis import memory
first = memory._measure(sys.argv[1], 4, 1)
jax.clear_caches()  # the second compilation asks the persistent cache, as a second process would
second = memory._measure(sys.argv[1], 4, 1)
print(json.dumps([first["step_from_cache"], second["step_from_cache"]]))
"""


def test_a_training_step_with_f9s_onednn_kernels_is_kept_by_the_compilation_cache(tmp_path):
    """F9 measures with oneDNN as XLA's library (``ONEDNN_CACHEABLE_FLAG``, as ``make book`` does; the tests' own
    processes use XLA's kernels) so that its measuring process can load the step its compiling process compiled:
    the smoke model's step compiled so is stored by the persistent cache and found there."""
    import sys

    import forked

    smoke = yaml.safe_load((paths.CONFIG / "smoke" / "diffeqformer.yaml").read_text())
    run = fake_run(tmp_path, "smoke", model=smoke["model"], losses={0: 8.0, 1: 7.0})
    out = forked.run([sys.executable, "-c", _TWICE, run, str(tmp_path / "cache")])
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, True]


def test_measure_training_step_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="batch and steps must be positive"):
        memory.measure_training_step(tmp_path, batch=0)
    with pytest.raises(FileNotFoundError, match="no finished run"):
        memory.measure_training_step(tmp_path / "nothing")
    smoke = yaml.safe_load((paths.CONFIG / "smoke" / "diffeqformer.yaml").read_text())
    run = fake_run(tmp_path, "smoke", model=smoke["model"], losses={0: 8.0, 1: 7.0})
    with pytest.raises(FileNotFoundError, match="no finished run"):  # checked before any process starts
        memory.measure_training_steps([run, tmp_path / "nothing"])


def test_time_embedding_figure_shows_each_seed():
    """F9's perplexity panel shows the spread: a dot per seed beside the mean."""
    import pandas as pd

    table = pd.DataFrame({"d_t": [2, 8, 32], "final ppl": [487.5, 481.8, 490.8], "params": [1, 2, 3],
                          "tokens/s": [5.0, 5.0, 5.0], "finals": [(470.0, 490.0, 502.5), (470.0, 481.0, 494.4),
                                                                  (482.0, 491.0, 499.4)]})
    fig = plots.time_embedding(table)
    dots = fig.axes[0].collections[0].get_offsets()
    assert len(dots) == 9 and sorted(dots[:, 1].tolist()) == sorted(v for f in table.finals for v in f)
