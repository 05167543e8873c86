"""diffeqformer.pipeline.cluster: the trainings handed to SLURM, one batch script each, in the order their
dependencies need, then the job that runs the pipeline for the notebooks and the book (a stand-in ``sbatch`` records
what it is given; slow: stand-ins of ``sbatch`` and ``srun`` run each job as two local processes); and the cluster
page's cost tables, computed from the configs and the measurements."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from diffeqformer import config as configs
from diffeqformer import paths, pipeline, runs
from diffeqformer.pipeline import PipelineError, Run, cluster, cost
from diffeqformer.pipeline.registry import seeded

RECORDING_SBATCH = """#!{python}
import json, sys
from pathlib import Path
log = Path({log!r})
jobs = log.read_text().splitlines() if log.exists() else []
with log.open("a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
print(f"{{100 + len(jobs)}};cluster")
"""


def runs_notebook(folder: Path) -> tuple[Path, Path]:
    """A notebook ``nb`` that declares ``runs: list``, and a table of contents with it: (its folder, the toc)."""
    (folder / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    params = nbformat.v4.new_code_cell('preset: str = "x"\nruns: list = []')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params]
    nbformat.write(nb, folder / "notebooks" / "nb.ipynb")
    (folder / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n- file: notebooks/nb\n")
    return folder / "notebooks", folder / "_toc.yml"


REGISTRY = {"t": {"nb": dict(runs=[Run("smoke/gpt2"), Run("smoke/finetune_gpt2_lora", module="finetune"),
                                   *pipeline.seeded(Run("smoke/diffeqformer"), 2, population=True),
                                   Run("smoke/shared")])}}
"""A pretraining, its fine-tuning, a population of two seeds, and a run that is complete."""


@pytest.fixture(scope="module")
def submitted(tmp_path_factory):
    """``REGISTRY``'s plan submitted through a stand-in sbatch that records its arguments: (jobs, the recorded calls
    as (dependencies, script text), the plan)."""
    tmp_path = tmp_path_factory.mktemp("slurm")
    log, sbatch = tmp_path / "sbatch.log", tmp_path / "sbatch"
    sbatch.write_text(RECORDING_SBATCH.format(python=sys.executable, log=str(log)))
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
        monkeypatch.setattr(paths, "HOME", tmp_path)
        nbdir, toc = runs_notebook(tmp_path)
        result = pipeline.plan("t", registry=REGISTRY, notebooks_dir=nbdir, toc=toc)
        done = next(t for t in result.trainings if t.config == "smoke/shared")  # a complete run is not submitted
        done.done = True
        return _submit(result, sbatch, log, tmp_path)


def _submit(result, sbatch: Path, log: Path, tmp_path: Path):
    slurm = cluster.Slurm(nodes=2, gpus_per_node=4, time="1:00:00", partition="gpu", extra=("--account=abc",),
                          sbatch=str(sbatch))
    jobs = cluster.submit(result, slurm, ["-m", "diffeqformer.pipeline", "--preset", "smoke"], stream=io.StringIO())
    calls = []
    for line in log.read_text().splitlines():
        args = json.loads(line)
        assert args[0] == "--parsable"
        after = args[1].removeprefix("--dependency=afterok:").split(":") if len(args) == 3 else []
        calls.append((after, (tmp_path / args[-1]).read_text()))
    return jobs, calls, result


def _argv(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_each_training_is_one_job_after_its_caches_and_pretraining(submitted):
    jobs, calls, result = submitted
    trainings = [t for t in result.trainings if not t.done]
    units = pipeline.lanes.training_units(trainings)
    assert len(calls) == len(jobs) == len(units) + len({t.data for t in trainings}) + 1
    ids = {text.split("--job-name=")[1].split("\n")[0]: str(100 + i) for i, (_, text) in enumerate(calls)}
    assert ids == jobs
    for unit in units:
        name = unit[0].name + (f"-population{len(unit)}" if len(unit) > 1 else "")
        after, text = calls[int(jobs[name]) - 100]
        assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n" in text and "#SBATCH --gpus-per-node=4" in text
        assert all(f"#SBATCH {option}\n" in text for option in ("--partition=gpu", "--account=abc", "--time=1:00:00"))
        assert _argv(text).startswith(f"srun {sys.executable} -m diffeqformer.")
        caches = [a for a in after if a in {jobs[n] for n in jobs if n.startswith("caches-")}]
        assert len(caches) == 1 and int(caches[0]) < int(jobs[name])
        for t in unit:
            for pre in t.after:  # a fine-tuning runs after its pretraining, which was submitted before it
                pre_unit = next(u for u in units if any(p.config == pre for p in u))
                assert jobs[pre_unit[0].name] in after
    assert not any("smoke-shared" in text for _, text in calls)


def test_a_population_is_one_job_and_the_commands_train_what_the_lanes_would(submitted):
    jobs, calls, result = submitted
    by_name = {text.split("--job-name=")[1].split("\n")[0]: _argv(text) for _, text in calls}
    populations = [n for n in by_name if n.endswith("-population2")]
    assert populations, "the smoke preset trains seeds together"
    for name in populations:
        assert " -m diffeqformer.population --config " in by_name[name] and by_name[name].endswith("--seeds 2")
    lora = next(t for t in result.trainings if t.config.startswith("smoke/finetune_gpt2_lora"))
    assert by_name[lora.name].endswith(f"-m diffeqformer.finetune --config {lora.path}" +
                                       "".join(f" {o}" for o in lora.run.overrides))


def test_the_last_job_runs_the_pipeline_after_every_training(submitted):
    jobs, calls, _ = submitted
    after, text = calls[-1]
    trainings = {v for k, v in jobs.items() if not k.startswith("caches-") and k != "pipeline"}
    assert set(after) == trainings
    assert _argv(text) == f"{sys.executable} -m diffeqformer.pipeline --preset smoke"
    assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n" in text
    for name in (n for n in jobs if n.startswith("caches-")):
        after, text = calls[int(jobs[name]) - 100]
        assert after == [] and " -m diffeqformer.pipeline.cluster prepare --config " in _argv(text)
        assert "--gpus-per-node" not in text


def test_bad_options_are_refused_naming_them(tmp_path):
    plan = pipeline.Plan("x")
    for slurm, option in ((cluster.Slurm(nodes=0), "--nodes"), (cluster.Slurm(gpus_per_node=-1), "--gpus-per-node"),
                          (cluster.Slurm(time="a day"), "--time")):
        with pytest.raises(PipelineError, match=f"^{option} "):
            cluster.submit(plan, slurm, ["-m", "x"], stream=io.StringIO())
    with pytest.raises(PipelineError, match="no /nonexistent/sbatch command here"):
        cluster.submit(plan, cluster.Slurm(sbatch="/nonexistent/sbatch"), ["-m", "x"], stream=io.StringIO())


def test_the_pipeline_command_submits_the_preset(tmp_path, monkeypatch):
    """``python -m diffeqformer.pipeline --preset smoke --slurm ...`` (its ``main``): with a recording ``sbatch`` on
    PATH, every training of the preset is submitted with the options given, then the pipeline again with the same
    preset and options, without ``--slurm``."""
    log, bin_dir = tmp_path / "sbatch.log", tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(RECORDING_SBATCH.format(python=sys.executable, log=str(log)))
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(paths, "HOME", tmp_path)
    monkeypatch.setattr(paths, "RUNS", tmp_path / "runs")
    pipeline.build.main(["--preset", "smoke", "--no-book", "--slurm", "--nodes", "1", "--gpus-per-node", "2",
                         "--time", "30"])
    texts = [Path(json.loads(line)[-1]).read_text() for line in log.read_text().splitlines()]
    units = pipeline.lanes.training_units(pipeline.plan("smoke").trainings)
    trainings = [t for t in texts if "\nsrun " in t]
    assert len(trainings) == len(units) > 3
    assert all("#SBATCH --ntasks-per-node=2\n" in t and "#SBATCH --time=30\n" in t for t in trainings)
    assert all(" -m diffeqformer." in _argv(t) and " --config " in _argv(t) for t in trainings)
    assert _argv(texts[-1]) == f"{sys.executable} -m diffeqformer.pipeline --preset smoke --no-book"


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


# ------------------------------------------------------------------ a stand-in cluster on this machine (slow)

STAND_IN_SBATCH = """#!{python}
# sbatch on one machine: runs each script at once, as the job it would be (after its dependencies succeeded)
import os, re, subprocess, sys
from pathlib import Path
jobs = Path({jobs!r})
args = sys.argv[1:]
script = Path(args[-1])
after = next((a.split(":")[1:] for a in args if a.startswith("--dependency=afterok:")), [])
job = {first_job} + len(list(jobs.glob("*.rc")))
options = dict(re.findall(r"#SBATCH --([\\w-]+)=(\\S+)", script.read_text()))
tasks = int(options["nodes"]) * int(options["ntasks-per-node"])
env = {{**os.environ, "SLURM_JOB_ID": str(job), "SLURM_NTASKS": str(tasks), "SLURM_JOB_NUM_NODES": options["nodes"],
       "SLURM_JOB_NODELIST": "127.0.0.1"}}
if all((jobs / f"{{a}}.rc").read_text() == "0" for a in after):
    with open(options["output"].replace("%j", str(job)), "w") as log:
        rc = subprocess.run(["bash", str(script)], env=env, stdout=log, stderr=subprocess.STDOUT).returncode
else:
    rc = "dependency failed"
(jobs / f"{{job}}.rc").write_text(str(rc))
print(job)
"""

STAND_IN_SRUN = """#!{python}
# srun on one machine: SLURM_NTASKS local processes, with the variables srun gives each task
import os, subprocess, sys
tasks = int(os.environ["SLURM_NTASKS"])
procs = [subprocess.Popen(sys.argv[1:], env={{**os.environ, "SLURM_PROCID": str(k), "SLURM_LOCALID": str(k),
                                             "SLURM_STEP_NODELIST": "127.0.0.1", "SLURMD_NODENAME": "127.0.0.1",
                                             "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": str(tasks)}})
         for k in range(tasks)]
sys.exit(max(p.wait() for p in procs))
"""


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.mark.slow
def test_a_stand_in_cluster_trains_each_run_as_two_processes_then_runs_the_pipeline(tmp_path, monkeypatch):
    """With ``sbatch`` and ``srun`` stand-ins on PATH that run each job at once as two local processes (SLURM's
    variables naming 127.0.0.1): the pretraining (a population of two seeds, ``diffeqformer.population``), then its
    LoRA fine-tuning (``diffeqformer.finetune``), each trained by two processes into complete runs, then the pipeline
    job, which trains nothing again and executes the notebook."""
    from test_devices import slurm_job_id

    from diffeqformer import runs as run_dirs

    first_job = slurm_job_id()  # the jobs' ids count up from one whose coordinator port is free
    bin_dir, jobs = tmp_path / "bin", tmp_path / "jobs"
    bin_dir.mkdir()
    jobs.mkdir()
    _executable(bin_dir / "sbatch", STAND_IN_SBATCH.format(python=sys.executable, jobs=str(jobs), first_job=first_job))
    _executable(bin_dir / "srun", STAND_IN_SRUN.format(python=sys.executable))
    home = tmp_path / "home"
    home.mkdir()
    (home / "data").symlink_to(paths.DATA)  # the token caches there are built
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax-cache"))
    monkeypatch.setattr(paths, "HOME", home)
    monkeypatch.setattr(paths, "RUNS", home / "runs")
    nbdir, toc = runs_notebook(tmp_path)
    pretraining = seeded(Run("smoke/gpt2"), 2, population=True)  # one population job of 2 seeds
    lora = Run("smoke/finetune_gpt2_lora", ("--pretrain.population", "2"), module="finetune")  # from seed 0
    registry = {"t": {"nb": dict(runs=[*pretraining, lora])}}
    result = pipeline.plan("t", registry=registry, notebooks_dir=nbdir, toc=toc)
    then = ["-c", "from pathlib import Path; from diffeqformer import pipeline; from diffeqformer.pipeline import Run; "
            f"pipeline.run('t', registry={registry!r}, notebooks_dir=Path({str(nbdir)!r}), toc=Path({str(toc)!r}), "
            "build=False)"]
    out = io.StringIO()
    submitted = cluster.submit(result, cluster.Slurm(nodes=1, gpus_per_node=2), then, stream=out)
    logs = {name: (cluster.logs_dir() / f"{name}-{job}.log").read_text() for name, job in submitted.items()}
    for name, job in submitted.items():
        assert (jobs / f"{job}.rc").read_text() == "0", logs[name][-3000:]
    for t in result.trainings:
        assert run_dirs.is_complete(t.run_dir, t.config_hash), t.run_dir
        steps = run_dirs.read_metrics(t.run_dir).index
        assert len(steps) == len(set(steps))
    assert logs["pipeline"].count("(complete, not retrained)") == 3 and "execute nb" in logs["pipeline"]
    assert int(submitted["smoke-finetune-gpt2-lora"]) > int(submitted["smoke-gpt2-population2"])
    # each member of the population trained by the two processes learned from its own seed
    first, second = (run_dirs.read_metrics(t.run_dir)["train/loss"].dropna() for t in result.trainings[:2])
    assert first.index.equals(second.index) and not np.allclose(first, second)
