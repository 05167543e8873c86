"""benchmarks/gpu/bundle.py's pipeline probe, without its many minutes: the ``sitecustomize`` every process of the
probe inherits, how its records become distributions and kinds of process, and the ``--no-book`` pipeline that
run.sh's pipeline step runs before ``edition pack``."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys

import pytest

from diffeqformer import paths
from diffeqformer.pipeline import build

spec = importlib.util.spec_from_file_location("gpu_bundle", paths.REPO / "benchmarks" / "gpu" / "bundle.py")
bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)


def test_every_process_started_with_the_probe_on_its_path_records_its_modules(tmp_path):
    """A process and the process it starts (as Papermill starts a kernel: the environment inherited) each leave
    their command line and their modules' files, also the child that ends by ``os._exit`` (no atexit) after the
    probe's periodic record."""
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
    assert bundle.process_kind(f"{py} -m diffeqformer.pipeline --train-worker") == "training"
    assert bundle.process_kind(f"{py} -m diffeqformer.pipeline --preset smoke --no-book") == "pipeline"
    assert bundle.process_kind(f'{py} -m diffeqformer.pipeline.processes {{"input": "x"}}') == "papermill"
    assert bundle.process_kind(f"{py} -m ipykernel_launcher -f /tmp/k.json") == "kernel"
    assert bundle.process_kind(f"{py} -m diffeqformer.pipeline.edition pack --out x") == "pack"
    assert bundle.process_kind(f"{py} -m diffeqformer.train --config c.yaml") == bundle.CACHES_READY
    kinds = {"writer": ["training"], "both": ["training", bundle.CACHES_READY], "nb": ["kernel"],
             "all": ["kernel", "training"]}
    assert bundle.cache_writer_only(kinds) == ["writer"]


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


def test_no_book_runs_the_pipeline_without_building_the_book(monkeypatch, tmp_path):
    """``--no-book`` (run.sh's pipeline step): the pipeline runs with ``build=False``, and the book step neither
    builds nor fails; the preset's record, which ``edition pack`` reads, is written all the same
    (``_move_into_place``, tests/test_pipeline.py's tiny pipelines)."""
    called = {}
    monkeypatch.setattr(build, "run", lambda preset, overrides, **kw: called.update(preset=preset, **kw))
    build.main(["--preset", "gpu", "--no-book"])
    assert called["preset"] == "gpu" and called["build"] is False

    def refuse(*args):
        raise AssertionError("the book was built")

    monkeypatch.setattr(build, "build_book", refuse)
    (tmp_path / "src").mkdir()
    progress = build.Progress([("build the book", 0.0)], io.StringIO())
    assert build._build_step(tmp_path / "src", tmp_path, {"seconds": {}}, progress, 0, False, False) is None


@pytest.mark.parametrize("target", ["train", "measure", "pipeline"])
def test_every_target_has_a_probe(target):
    assert target in bundle.PROBES
