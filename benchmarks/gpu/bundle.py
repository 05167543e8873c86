"""The wheels a GPU machine without network lacks for training this project, cut into parts of at most 56 MiB.

The GPU machine this was made for runs Python 3.12 with JAX 0.11.2 for CUDA 13 and has no network
(``preinstalled-packages.txt`` lists what it has): every other package a training imports must travel with the
working tree, in parts small enough for a transfer with a size limit (most bundles are one part).

    python benchmarks/gpu/bundle.py plan        # what training imports, what the machine lacks, wheel sizes
    python benchmarks/gpu/bundle.py plan --for pipeline   # the same for every process of the workflow
    python benchmarks/gpu/bundle.py download    # those wheels (requirements.lock's versions) into .gpu/part-K/
    python benchmarks/gpu/bundle.py verify DIR  # on the machine: installed versions against the bundle's needs
    python benchmarks/gpu/bundle.py present     # what training imports that the machine has (for simulate.sh)

``plan`` and ``download`` run here, in the project's environment: a smoke training runs in a child process (and
the modules the GPU benchmarks use are imported), and every distribution that owns a file of an imported module is
needed; the ones ``preinstalled-packages.txt`` names are already there. ``download`` writes the parts with a
``manifest.json`` (every wheel of every part) in each, which ``benchmarks/gpu/run.sh`` reads on the machine.

``--for pipeline`` bundles what the whole workflow imports (``benchmarks/gpu/run.sh pipeline``): every Python process
of the smoke preset's workflow without its book (Snakemake's target ``notebooks``: Snakemake itself, its token-cache,
training and notebook jobs, the notebooks' kernels) and of its ``edition pack``, in a fresh ``DIFFEQFORMER_HOME``
(``pipeline_distributions``: a ``sitecustomize`` on their path records each process's modules; the jobs Snakemake
starts, and the kernels a notebook job starts, inherit it), kept in ``.gpu/probe-pipeline.json`` while
requirements.lock and the code are those it ran with. ``plan --for pipeline`` says which kinds of process
(``process_kind``) import each wheel, and what only writing the corpus and its token caches needs. With every
target, what is imported but never used is left out: ``LEFT_OUT`` (optional imports) and ``STUBS`` (imported at a
module's top, never called; a small wheel of stand-in modules takes their place).

``--for measure`` bundles what ``benchmarks/gpu/measure.py`` imports instead (the models and a training step, not
Levanter's data stack): one part, which the machine installs and measures with in one command. The measurements
of 2026-11-25 took it with ``--also chex diffrax equinox jaxtyping lineax optax optimistix wadler-lindig`` (the
JAX libraries at the versions the tests run with, though the machine has its own).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
PREINSTALLED = HERE / "preinstalled-packages.txt"
LOCK = REPO / "requirements.lock"
OUT = REPO / ".gpu"
PART_LIMIT_MIB = 56.0
"""Wheels per part: a part, the corpus archive (5 MiB) and the working tree (2 MiB) fit a transfer of 64 MiB."""
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64"]
"""The GPU machine is x86-64 Linux with glibc 2.35 or newer: any of these wheels runs there."""

TRAIN_PROBE = r"""
import importlib, importlib.metadata as md, json, os, sys, tempfile
from diffeqformer import config as configs, train
for module in ("diffeqformer.finetune", "diffeqformer.analysis.ablations", "diffeqformer.analysis.memory",
               "diffeqformer.analysis.inference", "diffeqformer.analysis.spectra", "diffeqformer.workflow.jobs"):
    importlib.import_module(module)
with tempfile.TemporaryDirectory() as tmp:
    train.use_compilation_cache(os.path.join(tmp, "jax-cache"))
    config = os.path.join(sys.argv[1], "config", "smoke", "diffeqformer.yaml")
    train.main(configs.load_config(config, ["--run_dir", os.path.join(tmp, "run")]))
"""
"""What a smoke training imports (the modules the GPU benchmarks use too): the full bundle, three parts."""
MEASURE_PROBE = r"""
import importlib.metadata as md, json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "benchmarks", "gpu"))
import measure
for config in measure.PAIRS["cpu"]:
    measure.measure(config, [], 2, 1, 100)
"""
"""What ``benchmarks/gpu/measure.py`` imports (the models and their training step, not Levanter's data stack nor
the trainer): one part, which the machine installs and measures with in one command."""
OWNERS = r"""
owner = {}
for dist in md.distributions():
    for f in dist.files or []:
        owner[os.path.realpath(dist.locate_file(f))] = dist.metadata["Name"]
used = {owner.get(os.path.realpath(getattr(m, "__file__", None) or "")) for m in list(sys.modules.values())}
print("@dists " + json.dumps(sorted(d for d in used if d)))
"""


def normalise(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def preinstalled_packages(path: Path = PREINSTALLED) -> dict[str, str | None]:
    """The GPU machine's packages (``name``, ``name version`` or ``name==version`` lines): normalised name ->
    version where one is given, else None."""
    packages = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *version = line.replace("==", " ").split()
            packages[normalise(name)] = version[0] if version else None
    return packages


def locked_versions(path: Path = LOCK) -> dict[str, tuple[str, str]]:
    """requirements.lock: normalised name -> (name, version)."""
    locked = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.strip().split("==")
            locked[normalise(name)] = (name, version)
    return locked


SITECUSTOMIZE = r"""
# The pipeline probe's (benchmarks/gpu/bundle.py): every Python process started with this folder on PYTHONPATH
# writes the files of the modules it has loaded, with its command line first, to DIFFEQFORMER_PROBE_OUT: every
# two seconds and at exit (a process ended by a signal or os._exit still leaves its last list).
import atexit, os, sys, threading, time

_path = os.path.join(os.environ["DIFFEQFORMER_PROBE_OUT"], f"modules-{os.getpid()}-{time.time_ns()}.txt")


def _dump():
    try:
        files = set()
        for module in list(sys.modules.values()):
            f = getattr(module, "__file__", None)
            if isinstance(f, str):
                files.add(f)
        tmp = _path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(" ".join(sys.orig_argv) + "\n" + "\n".join(sorted(files)) + "\n")
        os.replace(tmp, _path)
    except Exception:
        pass


def _every(seconds=2.0):
    while True:
        time.sleep(seconds)
        _dump()


threading.Thread(target=_every, daemon=True, name="bundle-probe").start()
atexit.register(_dump)
"""
"""What the ``pipeline`` probe puts on every process's path (as ``sitecustomize``): Snakemake, the jobs it starts
(their shell commands), the notebooks' kernels and the processes those start inherit PYTHONPATH."""
PROBE_PRESET = "smoke"
PIPELINE_PROBE = ["-s", str(REPO / "workflow" / "Snakefile"), "--cores", "all", "--rerun-incomplete",
                  "--scheduler", "greedy", "notebooks", "--config", f"preset={PROBE_PRESET}"]
"""The ``pipeline`` probe: Snakemake's arguments (``python -m snakemake``, in the fresh home as its ``--directory``)
for the smoke preset's whole workflow but its book, as ``run.sh pipeline`` runs the gpu preset's (every training
module, every notebook executed by Papermill with its own kernel), in a fresh DIFFEQFORMER_HOME (its corpus
prepared, its tokenizer and token caches written, as on a fresh GPU machine); then ``edition pack`` of what it
made."""
TOKENS = "tokens"
"""The process kind of the workflow's token-cache jobs (``jobs tokens``), which write a run's corpus and caches
before the trainings that read them."""
CACHES_READY = "training, caches ready"
"""The process kind of the probe's last training: the smoke model once more in the same home, after the workflow,
its corpus, tokenizer and token caches written already. A distribution that only the token-cache and training jobs
import, and this one does not, is needed only to write those (the data preparation and Levanter's cache writer)."""
JOB_KINDS = {"train": "training", "tokens": TOKENS, "notebook": "notebook", "book": "book", "publish": "publish"}
"""The kinds of process of the workflow's jobs, by the verb of ``python -m diffeqformer.workflow.jobs VERB``: a
notebook job runs Papermill in its own process (its kernel is a process of kind ``kernel``); the probe runs no book
and no publish job (the target ``notebooks``)."""
PROBES = {"train": TRAIN_PROBE, "measure": MEASURE_PROBE, "pipeline": PIPELINE_PROBE}
LEFT_OUT = {
    "debugpy": "ipykernel's debugger, imported if it is there (try/except ImportError); no notebook is debugged",
    "gcsfs": "Papermill's handler of gs:// paths, imported if it is there; the workflow's paths are local",
    "google-auth-oauthlib": "gcsfs's", "requests-oauthlib": "google-auth-oauthlib's", "oauthlib": "theirs",
    "pulp": "the solver of Snakemake's ILP scheduler (35 MiB, with its CBC binaries), imported if it is there; "
            "run.sh schedules with --scheduler greedy, as Snakemake does without it",
}
"""Distributions the probes see imported that the bundle leaves out: every import of them is optional (guarded by
``except ImportError``), and what they add is never used by a training or a notebook."""
STUBS = {
    "polars": ("polars", "deepdiff imports it if it is there; zephyr's shuffle and Parquet scanning import it at "
                         "the top and name its types in annotations, but Levanter's token caches never shuffle or "
                         "scan Parquet with zephyr"),
    "polars-runtime-32": (None, "polars's compiled half, 51 MiB"),
    "vortex-data": ("vortex", "zephyr's readers and writers import it at the top and call it only in their .vortex "
                              "functions, which Levanter's token caches never call"),
    "wandb": ("wandb", "levanter.tracker imports its W&B tracker at the top, which imports wandb and names a type of "
                       "it; the presets log to metrics.jsonl only (config.wandb off; the GPU machine has no network)"),
}
"""Distributions imported at the top of a module the workflow loads but never used by it: each is left out and a
stand-in module of the same name (``STUB``) takes its place, in one small wheel (``stub_wheel``) that travels with
the bundle. Using a stand-in raises ``RuntimeError`` naming what was left out; their sizes are most of what a
training's bundle weighs (polars and polars-runtime-32 52 MiB, vortex-data 42 MiB, wandb 19 MiB)."""
STUB = r'''"""A stand-in for {dist}, left out of the wheels taken to a GPU machine without network (bundle.py,
STUBS: {why}). Importing it works; a name of it is a placeholder class (annotations, isinstance), and using one raises
RuntimeError."""


class _Names(type):
    def __getattr__(cls, name):  # wandb.sdk.wandb_run.Run: a placeholder too
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{{cls.__qualname__}}.{{name}}")


class _LeftOut(metaclass=_Names):
    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{{type(self).__qualname__}}: {dist} is left out of the bundle on this machine "
                           "(benchmarks/gpu/bundle.py, STUBS)")


_names = {{}}


def _placeholder(name):
    if name not in _names:
        _names[name] = _Names(name.rsplit(".", 1)[-1], (_LeftOut,), {{"__module__": __name__, "__qualname__": name}})
    return _names[name]


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder(name)
'''
"""The stand-in module of a distribution of ``STUBS``."""
STUB_WHEEL = "diffeqformer_left_out-0-py3-none-any.whl"
PROBE_RECORD = OUT / "probe-pipeline.json"
"""The ``pipeline`` probe's last result (many minutes of CPU), reused while requirements.lock and the code are those
it ran with (``--reprobe`` runs it again)."""


def process_kind(command: str) -> str:
    """What a process of the pipeline probe was, from its command line (``sys.orig_argv``): ``snakemake``, a job of
    the workflow (``JOB_KINDS``), a notebook's ``kernel``, the edition's ``pack``, or the last training
    (``CACHES_READY``). By the module it runs (``-m``) or the script (Snakemake's entry point), not by a word
    anywhere in it: a training job's command names ``diffeqformer.train`` too, after its own verb."""
    words = command.split()
    module = words[words.index("-m") + 1] if "-m" in words[:-1] else None
    verb = words[words.index("-m") + 2] if module and len(words) > words.index("-m") + 2 else None
    script = Path(words[1]).name if len(words) > 1 and not words[1].startswith("-") else None
    if module == "diffeqformer.workflow.jobs" and verb in JOB_KINDS:
        return JOB_KINDS[verb]
    if module == "snakemake" or (module is None and script == "snakemake"):
        return "snakemake"
    if module == "diffeqformer.workflow.edition" and verb == "pack":
        return "pack"
    if module and module.startswith("ipykernel"):
        return "kernel"
    if module == "diffeqformer.train":
        return CACHES_READY
    return "other: " + " ".join(words[1:4])


def owners() -> dict[str, str]:
    """The real path of every file of every installed distribution -> that distribution's name.

    Each distribution's folder is resolved once and its files joined to it: resolving each of the ~52,000 files
    (``os.path.realpath`` stats every component of every path) took minutes on a slow disk."""
    import importlib.metadata as md

    owner = {}
    for dist in md.distributions():
        base = os.path.realpath(dist.locate_file(""))
        name = dist.metadata["Name"]
        for f in dist.files or []:
            owner[os.path.normpath(os.path.join(base, f))] = name
    return owner


def pipeline_distributions(keep: Path | None = None) -> dict[str, list[str]]:
    """The ``pipeline`` probe: distribution -> the kinds of process (``process_kind``) that imported a module of it,
    over every Python process of the smoke workflow and its pack (``PIPELINE_PROBE``), run in a fresh home in a
    temporary folder (or ``keep``, left there)."""
    with tempfile.TemporaryDirectory(prefix="diffeqformer-probe-") as tmp:
        root = keep or Path(tmp)
        home, site, out = root / "home", root / "site", root / "modules"
        for folder in (home / "data", site, out):
            folder.mkdir(parents=True, exist_ok=True)
        shutil.copytree(REPO / "data" / "raw", home / "data" / "raw", dirs_exist_ok=True)
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = {**os.environ, "DIFFEQFORMER_HOME": str(home), "DIFFEQFORMER_PROBE_OUT": str(out),
               "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
        log = root / "workflow.log"
        with log.open("w") as fh:
            for args in (["snakemake", "--directory", str(home), *PIPELINE_PROBE],
                         ["diffeqformer.workflow.edition", "pack", "--preset", PROBE_PRESET, "--out",
                          str(root / "edition")],
                         ["diffeqformer.train", "--config", str(REPO / "config" / "smoke" / "diffeqformer.yaml"),
                          "--run_dir", str(home / "runs" / "probe-caches-ready")]):
                rc = subprocess.run([sys.executable, "-m", *args], env=env, cwd=REPO, stdout=fh, stderr=fh).returncode
                if rc != 0:
                    tail = "\n".join(log.read_text().splitlines()[-40:])
                    raise SystemExit(f"the probe's {' '.join(args[:2])} failed (exit {rc}); the end of its log:\n{tail}")
        return kinds_of(out)


def kinds_of(records: Path) -> dict[str, list[str]]:
    """Distribution -> the kinds of process whose record in ``records`` (``SITECUSTOMIZE``'s) names a file of it."""
    owner, kinds = owners(), {}
    for record in sorted(records.glob("modules-*.txt")):
        command, *files = record.read_text().splitlines()
        for f in files:
            dist = owner.get(os.path.realpath(f))
            if dist:
                kinds.setdefault(dist, set()).add(process_kind(command))
    return {dist: sorted(k) for dist, k in sorted(kinds.items())}


def probe_key() -> str:
    """What the ``pipeline`` probe's result depends on: requirements.lock, the package, notebooks and configs, the
    workflow (its Snakefile) and this file (its process kinds)."""
    import hashlib

    digest = hashlib.sha256(LOCK.read_bytes())
    for folder in ("src/diffeqformer", "notebooks", "config", "workflow", "benchmarks/gpu/bundle.py"):
        for f in sorted((REPO / folder).rglob("*")) if (REPO / folder).is_dir() else [REPO / folder]:
            if (f.suffix in (".py", ".ipynb", ".yaml") or f.name == "Snakefile") and f.is_file():
                digest.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


def pipeline_kinds(reprobe: bool = False) -> dict[str, list[str]]:
    """``pipeline_distributions``, from ``PROBE_RECORD`` where it was made with this ``probe_key``."""
    key = probe_key()
    if not reprobe and PROBE_RECORD.exists():
        record = json.loads(PROBE_RECORD.read_text())
        if record.get("key") == key:
            return record["distributions"]
    print("probing the smoke workflow (every process it starts, many minutes) ...", file=sys.stderr, flush=True)
    kinds = pipeline_distributions()
    PROBE_RECORD.parent.mkdir(parents=True, exist_ok=True)
    PROBE_RECORD.write_text(json.dumps({"key": key, "distributions": kinds}, indent=1) + "\n")
    return kinds


def cache_writer_only(kinds: dict[str, list[str]]) -> list[str]:
    """The distributions that only the workflow's token-cache and training jobs import, and a training does not once
    the corpus and its caches are written: what writing those needs, and nothing else."""
    return sorted(d for d, k in kinds.items() if k and set(k) <= {TOKENS, "training"})


@functools.lru_cache(maxsize=None)
def imported_distributions(target: str = "train", reprobe: bool = False) -> list[str]:
    """The distributions that own a module the ``target`` probe (``PROBES``) loads, measured in a child process of
    this Python (``pipeline``: in every process of the smoke workflow, ``pipeline_kinds``); once per command."""
    if target == "pipeline":
        return list(pipeline_kinds(reprobe))
    probe = PROBES[target] + OWNERS
    out = subprocess.run([sys.executable, "-c", probe, str(REPO)], capture_output=True, text=True, cwd=REPO)
    lines = [line for line in out.stdout.splitlines() if line.startswith("@dists ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"the probe training failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("@dists "))


def missing_requirements(also: list[str] = (), target: str = "train", reprobe: bool = False) -> list[str]:
    """``name==version`` (requirements.lock's) of every imported distribution the GPU machine does not have, and
    of ``also`` (packages it has at a version that does not do, as ``verify`` found there)."""
    have, locked = preinstalled_packages(), locked_versions()
    wanted = [normalise(d) for d in imported_distributions(target, reprobe) if normalise(d) != "diffeqformer"]
    absent = sorted({d for d in wanted if d not in have and d not in LEFT_OUT and d not in STUBS}
                    | {normalise(a) for a in also})
    unlocked = [d for d in absent if d not in locked]
    if unlocked:
        raise SystemExit(f"not in requirements.lock: {', '.join(unlocked)}; regenerate the lock first")
    return [f"{locked[d][0]}=={locked[d][1]}" for d in absent]


def present_requirements(target: str = "train", reprobe: bool = False) -> list[str]:
    """``name==version`` of every imported distribution the GPU machine has: the version seen there where one was
    recorded, else requirements.lock's (a guess). ``simulate.sh`` builds a stand-in of the machine from these."""
    have, locked = preinstalled_packages(), locked_versions()
    wanted = sorted({normalise(d) for d in imported_distributions(target, reprobe)} & set(have))
    return [f"{locked[d][0]}=={have[d] or locked[d][1]}" for d in wanted]


def stubbed(target: str = "train", reprobe: bool = False) -> list[str]:
    """The distributions of ``STUBS`` that the ``target`` probe saw imported and the GPU machine lacks."""
    have = preinstalled_packages()
    wanted = {normalise(d) for d in imported_distributions(target, reprobe)}
    return sorted(d for d in STUBS if d in wanted and d not in have)


def stub_wheel(dists: list[str], dest: Path) -> Path:
    """One wheel (``STUB_WHEEL``) of the stand-in modules of ``dists`` (``STUBS``), written into ``dest``."""
    import base64
    import hashlib
    import zipfile

    info = "diffeqformer_left_out-0.dist-info"
    files = {f"{STUBS[d][0]}/__init__.py": STUB.format(dist=d, why=STUBS[d][1]) for d in dists if STUBS[d][0]}
    files[f"{info}/METADATA"] = ("Metadata-Version: 2.1\nName: diffeqformer-left-out\nVersion: 0\nSummary: stand-ins "
                                 f"for {', '.join(dists)} (benchmarks/gpu/bundle.py, STUBS)\n")
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: bundle.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    wheel = dest / STUB_WHEEL
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def download(requirements: list[str], dest: Path) -> list[Path]:
    """Binary wheels for CPython 3.12 on x86-64 Linux, without their dependencies (each is in the list itself)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--dest", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd + requirements, check=True)
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != len(requirements):
        raise SystemExit(f"expected {len(requirements)} wheels in {dest}, found {len(wheels)}")
    return wheels


def split(files: list[Path], limit_mib: float = PART_LIMIT_MIB) -> list[list[Path]]:
    """Parts of at most ``limit_mib`` each (first fit, largest file first); a single larger file is refused."""
    parts: list[list[Path]] = []
    sizes: list[float] = []
    for f in sorted(files, key=lambda p: p.stat().st_size, reverse=True):
        size = f.stat().st_size / 2**20
        if size > limit_mib:
            raise SystemExit(f"{f.name} alone is {size:.1f} MiB, more than a part may hold ({limit_mib} MiB)")
        for k, used in enumerate(sizes):
            if used + size <= limit_mib:
                parts[k].append(f)
                sizes[k] += size
                break
        else:
            parts.append([f])
            sizes.append(size)
    return parts


def write_parts(parts: list[list[Path]], out: Path = OUT) -> None:
    """``out/part-K/`` with the part's wheels and the manifest of all parts."""
    for old in out.glob("part-*"):
        shutil.rmtree(old)
    manifest = {"parts": [[w.name for w in part] for part in parts]}
    for k, part in enumerate(parts, 1):
        folder = out / f"part-{k}"
        folder.mkdir(parents=True)
        for wheel in part:
            shutil.copy2(wheel, folder / wheel.name)
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def verify(site: Path) -> list[str]:
    """On the machine, with the bundle installed in ``site`` and on ``sys.path``: the requirements of the packages
    in ``site`` that an installed version (the bundle's or the machine's own) does not meet (extras left out,
    markers evaluated). Requirements that nothing installed provides are counted, not listed: the bundle leaves out
    on purpose every package that training never imports (Levanter declares many it imports only for cloud work)."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    installed = {normalise(d.metadata["Name"]): d.version for d in md.distributions()}
    bundled = list(md.distributions(path=[str(site)]))
    if not bundled:
        raise SystemExit(f"no installed package in {site}")
    outside, left_out = [], set()
    for dist in bundled:
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = installed.get(normalise(req.name))
            if have is None:
                left_out.add(normalise(req.name))
            elif not req.specifier.contains(have, prereleases=True):
                outside.append(f"{dist.metadata['Name']} {dist.version} asks for {req}; installed: {have}")
    print(f"{len(bundled)} bundled packages; {len(left_out)} packages they declare are not installed (never imported "
          f"by training)")
    return outside


def print_importers(wheels: list[Path]) -> None:
    """``plan --for pipeline``: each bundled wheel's size under the kinds of process that import it, and what only
    writing the corpus and its caches needs (``cache_writer_only``)."""
    kinds = {normalise(d): k for d, k in pipeline_kinds().items()}
    groups: dict[str, list[Path]] = {}
    for w in wheels:
        groups.setdefault(", ".join(kinds.get(normalise(w.name.split("-")[0]), ["--also"])), []).append(w)
    print("imported by (kinds of process of the smoke workflow):")
    for group, members in sorted(groups.items(), key=lambda g: -sum(w.stat().st_size for w in g[1])):
        size = sum(w.stat().st_size for w in members) / 2**20
        print(f"  {group}: {len(members)} wheels, {size:.1f} MiB: "
              + ", ".join(w.name.split("-")[0] for w in sorted(members, key=lambda w: -w.stat().st_size)))
    only = {normalise(d) for d in cache_writer_only(pipeline_kinds())}
    writer = [w for w in wheels if normalise(w.name.split("-")[0]) in only]
    size = sum(w.stat().st_size for w in writer) / 2**20
    print(f"needed only to write the corpus and its token caches: {len(writer)} wheels, {size:.1f} MiB"
          + (": " + ", ".join(w.name.split("-")[0] for w in writer) if writer else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("plan", "download", "verify", "present"))
    parser.add_argument("site", nargs="?", type=Path, help="verify: the folder the bundle is installed in")
    parser.add_argument("--also", nargs="+", default=[], metavar="NAME",
                        help="also bundle these packages the machine has at a version that does not do")
    parser.add_argument("--for", dest="target", choices=sorted(PROBES), default="train",
                        help="what the bundle is for: a training (default), benchmarks/gpu/measure.py alone, or "
                             "the whole workflow (run.sh pipeline; every process of the smoke workflow: Snakemake, "
                             "its jobs, the notebooks' kernels, the pack)")
    parser.add_argument("--reprobe", action="store_true",
                        help="--for pipeline: probe again even if the last probe's record is of this code")
    args = parser.parse_args()
    if args.command == "verify":
        if args.site is None:
            parser.error("verify needs the folder the bundle is installed in")
        outside = verify(args.site)
        for line in outside:
            print(f"  version outside a requirement: {line}")
        print(f"{len(outside)} installed versions outside a bundled package's requirements" + (
            ": training decides (run.sh's train step); if it fails on one of them, bundle ours with "
            "`bundle.py download --also NAME`" if outside else ""))
        return
    if args.command == "present":
        print("\n".join(present_requirements(args.target, args.reprobe)))
        return
    requirements = missing_requirements(args.also, args.target, args.reprobe)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = download(requirements, Path(tmp))
        stubs = stubbed(args.target, args.reprobe)
        if stubs:
            wheels.append(stub_wheel(stubs, Path(tmp)))
            print(f"left out, a stand-in module in {STUB_WHEEL} in their place: {', '.join(stubs)}")
        imported = {normalise(i) for i in imported_distributions(args.target, args.reprobe)}
        left = sorted(d for d in LEFT_OUT if d in imported)
        if left:
            print(f"left out, imported only if there: {', '.join(left)}")
        total = sum(w.stat().st_size for w in wheels) / 2**20
        parts = split(wheels)
        print(f"{len(wheels)} wheels the GPU machine lacks, {total:.1f} MiB in {len(parts)} parts:")
        for k, part in enumerate(parts, 1):
            size = sum(w.stat().st_size for w in part) / 2**20
            names = ", ".join(f"{w.name.split('-')[0]} ({w.stat().st_size / 2**20:.1f})" for w in part[:4])
            print(f"  part-{k}: {len(part)} wheels, {size:.1f} MiB: {names}{', ...' if len(part) > 4 else ''}")
        if args.target == "pipeline":
            print_importers(wheels)
        if args.command == "download":
            write_parts(parts)
            print(f"written to {OUT.relative_to(REPO)}/part-1 ... part-{len(parts)}")


if __name__ == "__main__":
    main()
