"""benchmarks/gpu/bundle.py's pipeline probe, without its many minutes: the ``sitecustomize`` every process of the
probe inherits, how its records become distributions and kinds of process, and the workflow the probe runs (and
run.sh's pipeline step runs before ``edition pack``): Snakemake's target ``notebooks``, every training and notebook
but no book, each job a kind of process the probe knows, each writing what ``edition pack`` reads."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from diffeqformer import paths
from diffeqformer.workflow import plan

spec = importlib.util.spec_from_file_location("gpu_bundle", paths.REPO / "benchmarks" / "gpu" / "bundle.py")
bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)


def test_every_process_started_with_the_probe_on_its_path_records_its_modules(tmp_path):
    """A process and the process it starts (as Snakemake starts a job and a notebook job its kernel: the environment
    inherited) each leave their command line and their modules' files, also the child that ends by ``os._exit`` (no
    atexit) after the probe's periodic record."""
    site, out = tmp_path / "site", tmp_path / "out"
    site.mkdir()
    out.mkdir()
    (site / "sitecustomize.py").write_text(bundle.SITECUSTOMIZE)
    env = {**os.environ, "DIFFEQFORMER_PROBE_OUT": str(out), "PYTHONPATH": str(site)}
    child = "import time, os, yaml; time.sleep(2.5); os._exit(0)"
    parent = f"import json, subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}], check=True)"
    subprocess.run([sys.executable, "-c", parent], env=env, check=True, timeout=60)
    records = {}
    for f in out.glob("modules-*.txt"):
        command, *files = f.read_text().splitlines()
        records[command] = files
    assert len(records) == 2, records
    [child] = [command for command in records if "subprocess" not in command]
    assert any(f.endswith(os.path.join("yaml", "__init__.py")) for f in records[child])
    assert bundle.kinds_of(out).get("PyYAML") == [bundle.process_kind(child)]


def test_process_kinds_and_what_only_the_cache_writer_needs():
    py = "/usr/bin/python3"
    jobs = f"{py} -m diffeqformer.workflow.jobs"
    assert bundle.process_kind(f"{py} /venv/bin/snakemake -s workflow/Snakefile --cores all notebooks "
                               f"--config preset=smoke") == "snakemake"
    assert bundle.process_kind(f"{py} -m snakemake -s workflow/Snakefile --unlock") == "snakemake"
    assert bundle.process_kind(f"{jobs} train --threads 1 --runs runs/a --hashes h --outputs runs/a/trained-h.json "
                               f"-- -m diffeqformer.train --config c.yaml") == "training"  # not by its argv's module
    assert bundle.process_kind(f"{jobs} tokens --module train --output t.json -- --config c.yaml") == bundle.TOKENS
    assert bundle.process_kind(f'{jobs} notebook --name f1_model --parameters {{"preset": "smoke"}}') == "notebook"
    assert bundle.process_kind(f"{jobs} book --preset smoke --output b.json") == "book"
    assert bundle.process_kind(f"{py} -m ipykernel_launcher -f /tmp/k.json") == "kernel"
    assert bundle.process_kind(f"{py} -m diffeqformer.workflow.edition pack --out x") == "pack"
    assert bundle.process_kind(f"{py} -m diffeqformer.train --config c.yaml") == bundle.CACHES_READY
    assert bundle.process_kind(f"{py} -c import sys").startswith("other: ")
    kinds = {"writer": ["training"], "tokens": [bundle.TOKENS], "both": [bundle.TOKENS, "training"],
             "ready": ["training", bundle.CACHES_READY], "nb": ["kernel"], "all": ["kernel", "training"],
             "snakemake": ["snakemake", bundle.TOKENS]}
    assert bundle.cache_writer_only(kinds) == ["both", "tokens", "writer"]


def test_the_probe_record_is_reused_only_for_the_same_code(tmp_path, monkeypatch):
    record = tmp_path / "probe.json"
    monkeypatch.setattr(bundle, "PROBE_RECORD", record)
    monkeypatch.setattr(bundle, "pipeline_distributions", lambda: {"fresh": ["kernel"]})
    record.write_text(json.dumps({"key": bundle.probe_key(), "distributions": {"kept": ["training"]}}))
    assert bundle.pipeline_kinds() == {"kept": ["training"]}
    assert bundle.pipeline_kinds(reprobe=True) == {"fresh": ["kernel"]}
    record.write_text(json.dumps({"key": "other code", "distributions": {"kept": ["training"]}}))
    assert bundle.pipeline_kinds() == {"fresh": ["kernel"]}
    assert json.loads(record.read_text())["key"] == bundle.probe_key()


RULE = re.compile(r"^(?:local)?rule (\w+):\n(.*?)(?=^\[|\Z)", flags=re.M | re.S)


@pytest.fixture(scope="module")
def probe_dry_run(tmp_path_factory):
    """The probe's own Snakemake command (``PIPELINE_PROBE``) as a dry run that prints each job's shell command, in a
    fresh home: rule name -> its block of the printout (output, benchmark, shell command)."""
    home = tmp_path_factory.mktemp("probe-home")
    out = subprocess.run([sys.executable, "-m", "snakemake", "--directory", str(home), "-n", "-p",
                          *bundle.PIPELINE_PROBE], capture_output=True, text=True, cwd=paths.REPO, timeout=600,
                         env={**os.environ, "DIFFEQFORMER_HOME": str(home)})
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return {m[1]: m[2] for m in RULE.finditer(out.stdout + out.stderr)}, home


def test_the_probe_runs_every_training_and_notebook_of_the_smoke_workflow_and_no_book(probe_dry_run):
    """Snakemake's target ``notebooks`` (what ``--no-book`` was, run.sh's pipeline step): every token cache,
    training and notebook of the smoke preset's plan, the target itself, and neither the book nor its publication.
    (That a notebook job's record and figures exist once it has succeeded, with or without the book, Snakemake
    guarantees of a job's outputs, and ``jobs.notebook`` writes them itself.)"""
    rules, home = probe_dry_run
    made = json.loads((home / "_build" / "workflow" / bundle.PROBE_PRESET / "plan.json").read_text())["plan"]
    expected = ({f"tokens_{d}" for d in made["tokens"]} | {f"train_{u['name']}" for u in made["trainings"]}
                | {f"notebook_{j['name']}" for j in made["notebooks"]} | {"notebooks"})
    assert set(rules) == expected
    assert {j["name"] for j in made["notebooks"]} == set(plan.toc_notebooks())


def _python_argv(block: str) -> list[str]:
    """The command line of the Python process a job's shell command starts (``( VAR=... python -m ... ) >log``),
    as that process's ``sys.orig_argv`` reads."""
    command = block.split("Shell command:", 1)[1].strip().splitlines()[0]
    words = shlex.split(command)
    words = words[words.index("(") + 1:words.index(")")] if "(" in words else words
    while words and re.fullmatch(r"\w+=.*", words[0]):  # the environment the command sets
        words = words[1:]
    return words


def test_every_job_of_the_probe_is_a_kind_of_process_it_knows_and_writes_what_pack_reads(probe_dry_run):
    """The kind of each job's process, as ``process_kind`` names it from the job's own command, is its rule's: a
    token cache, a training, a notebook (no job is "other"); the notebook jobs write the executed notebook, its
    record and its figures, and the trainings their benchmark, where ``edition.collect`` reads them."""
    rules, home = probe_dry_run
    expected = {"tokens": bundle.TOKENS, "train": "training", "notebook": "notebook"}
    work = os.path.relpath(plan.folder(bundle.PROBE_PRESET), paths.HOME)
    for name, block in rules.items():
        if name == "notebooks":
            continue
        kind = bundle.process_kind(" ".join(_python_argv(block)))
        assert kind == expected[name.split("_", 1)[0]], (name, kind, block)
        suffix = name.split("_", 1)[1]
        if name.startswith("notebook_"):
            outputs = re.search(r"^\s+output: (.*)$", block, flags=re.M)[1].split(", ")
            assert set(outputs) == {f"{work}/notebooks/{suffix}.ipynb", f"{work}/records/{suffix}.json",
                                    f"{work}/notebook-figures/{suffix}"}, outputs
        elif name.startswith("train_"):
            assert f"benchmark: {work}/benchmarks/train-{suffix}.tsv" in block


@pytest.mark.parametrize("target", ["train", "measure", "pipeline"])
def test_every_target_has_a_probe(target):
    assert target in bundle.PROBES


def test_gpu_install_names_a_missing_part_and_how_to_stage_it(tmp_path):
    """benchmarks/gpu/run.sh on a GPU machine where a part of the bundle was not copied: it installs nothing, names
    the part and says what to copy and run."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    wheels.mkdir()
    (wheels / "manifest.json").write_text(json.dumps({"parts": [["a.whl"], ["b.whl", "c.whl"]]}))
    (wheels / "a.whl").write_text("")
    (wheels / "b.whl").write_text("")
    out = subprocess.run(["bash", str(paths.REPO / "benchmarks" / "gpu" / "run.sh"), "install"], capture_output=True,
                         text=True, env={**os.environ, "DIFFEQFORMER_WHEELS": str(wheels),
                                         "DIFFEQFORMER_SITE": str(site), "PYTHON": sys.executable})
    assert out.returncode != 0 and not site.exists()
    assert "not staged on this machine: part-2 (1 of 2 wheels)" in out.stderr
    assert "Copy .gpu/part-2 into this working tree, then: bash benchmarks/gpu/run.sh stage install" in out.stderr
