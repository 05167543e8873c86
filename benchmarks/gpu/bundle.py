"""The wheels a lent GPU machine lacks for training this project, cut into parts the device tool can carry.

The H100/H200 machines this project borrows (the device tool) run Python 3.12 with JAX 0.11.2 for CUDA 13 and have
no network: every other package a training imports must travel with the working tree, at most 64 MiB a call.

    python benchmarks/gpu/bundle.py plan        # what training imports, what the machine lacks, wheel sizes
    python benchmarks/gpu/bundle.py download    # those wheels (requirements.lock's versions) into .gpu/part-K/
    python benchmarks/gpu/bundle.py verify DIR  # on the machine: installed versions against the bundle's needs
    python benchmarks/gpu/bundle.py present     # what training imports that the machine has (for simulate.sh)

``plan`` and ``download`` run here, in the project's environment: a smoke training runs in a child process (and
the modules the GPU benchmarks use are imported), and every distribution that owns a file of an imported module is
needed; the ones ``lent-machine-packages.txt`` names are already there. ``download`` writes the parts with a
``manifest.json`` (every wheel of every part) in each, which ``benchmarks/gpu/run.sh`` reads on the machine.

``--for measure`` bundles what ``benchmarks/gpu/measure.py`` imports instead (the models and a training step, not
Levanter's data stack): one part, which one device call installs and measures with. The measurements of
2026-11-25 carried it with ``--also chex diffrax equinox jaxtyping lineax optax optimistix wadler-lindig`` (the
JAX libraries at the versions the tests run with, though the machine has its own).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
LENT = HERE / "lent-machine-packages.txt"
LOCK = REPO / "requirements.lock"
OUT = REPO / ".gpu"
PART_LIMIT_MIB = 56.0
"""Wheels per part: the device tool carries 64 MiB a call, and the working tree and the corpus archive travel too."""
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64"]
"""The lent machines are x86-64 Linux with glibc 2.35 or newer: any of these wheels runs there."""

TRAIN_PROBE = r"""
import importlib, importlib.metadata as md, json, os, sys, tempfile
from diffeqformer import config as configs, train
for module in ("diffeqformer.finetune", "diffeqformer.analysis.ablations", "diffeqformer.analysis.inference",
               "diffeqformer.analysis.spectra", "diffeqformer.pipeline"):
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
the trainer): one part, so that a single device call installs it and measures."""
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


def lent_packages(path: Path = LENT) -> dict[str, str | None]:
    """The lent machine's packages: normalised name -> version where one was seen, else None."""
    packages = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *version = line.split()
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


PROBES = {"train": TRAIN_PROBE, "measure": MEASURE_PROBE}


def imported_distributions(target: str = "train") -> list[str]:
    """The distributions that own a module the ``target`` probe (``PROBES``) loads, measured in a child process of
    this Python."""
    probe = PROBES[target] + OWNERS
    out = subprocess.run([sys.executable, "-c", probe, str(REPO)], capture_output=True, text=True, cwd=REPO)
    lines = [line for line in out.stdout.splitlines() if line.startswith("@dists ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"the probe training failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("@dists "))


def missing_requirements(also: list[str] = (), target: str = "train") -> list[str]:
    """``name==version`` (requirements.lock's) of every imported distribution the lent machine does not have, and
    of ``also`` (packages it has at a version that does not do, as ``verify`` found there)."""
    lent, locked = lent_packages(), locked_versions()
    wanted = [normalise(d) for d in imported_distributions(target) if normalise(d) != "diffeqformer"]
    absent = sorted({d for d in wanted if d not in lent} | {normalise(a) for a in also})
    unlocked = [d for d in absent if d not in locked]
    if unlocked:
        raise SystemExit(f"not in requirements.lock: {', '.join(unlocked)}; regenerate the lock first")
    return [f"{locked[d][0]}=={locked[d][1]}" for d in absent]


def present_requirements(target: str = "train") -> list[str]:
    """``name==version`` of every imported distribution the lent machine has: the version seen there where one was
    recorded, else requirements.lock's (a guess). ``simulate.sh`` builds a stand-in of the machine from these."""
    lent, locked = lent_packages(), locked_versions()
    wanted = sorted({normalise(d) for d in imported_distributions(target)} & set(lent))
    return [f"{locked[d][0]}=={lent[d] or locked[d][1]}" for d in wanted]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("plan", "download", "verify", "present"))
    parser.add_argument("site", nargs="?", type=Path, help="verify: the folder the bundle is installed in")
    parser.add_argument("--also", nargs="+", default=[], metavar="NAME",
                        help="also carry these packages the machine has at a version that does not do")
    parser.add_argument("--for", dest="target", choices=sorted(PROBES), default="train",
                        help="what the bundle is for: a training (default) or benchmarks/gpu/measure.py alone")
    args = parser.parse_args()
    if args.command == "verify":
        if args.site is None:
            parser.error("verify needs the folder the bundle is installed in")
        outside = verify(args.site)
        for line in outside:
            print(f"  version outside a requirement: {line}")
        print(f"{len(outside)} installed versions outside a bundled package's requirements" + (
            ": training decides (run.sh's train step); if it fails on one of them, carry ours with "
            "`bundle.py download --also NAME`" if outside else ""))
        return
    if args.command == "present":
        print("\n".join(present_requirements(args.target)))
        return
    requirements = missing_requirements(args.also, args.target)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = download(requirements, Path(tmp))
        total = sum(w.stat().st_size for w in wheels) / 2**20
        parts = split(wheels)
        print(f"{len(wheels)} wheels the lent machine lacks, {total:.1f} MiB in {len(parts)} parts:")
        for k, part in enumerate(parts, 1):
            size = sum(w.stat().st_size for w in part) / 2**20
            names = ", ".join(f"{w.name.split('-')[0]} ({w.stat().st_size / 2**20:.1f})" for w in part[:4])
            print(f"  part-{k}: {len(part)} wheels, {size:.1f} MiB: {names}{', ...' if len(part) > 4 else ''}")
        if args.command == "download":
            write_parts(parts)
            print(f"written to {OUT.relative_to(REPO)}/part-1 ... part-{len(parts)}")


if __name__ == "__main__":
    main()
