"""The GPU edition of the book: what the ``gpu`` preset's workflow made on a GPU machine, packed there, checked and
installed here into ``book/gpu/`` (committed), and shown as the book's part "GPU edition" without executing again::

    python -m diffeqformer.workflow.edition pack --out DIR   # on the GPU machine, after the gpu workflow
    python -m diffeqformer.workflow.edition import DIR       # here: check the pack, then install it into book/gpu/

A pack is ``manifest.json`` and one zip archive cut into at most seven parts of at most 16 MiB (``edition.zip.001``,
...; ``cat edition.zip.* > edition.zip`` joins them): the executed notebooks (their figures are the PNGs in their
outputs), the figures' data (not their images), the executions' records, each run's config, ``complete.json`` and
metrics (no weights), the jobs' timings. The manifest says the preset, device, date, commit and wall time, the files,
the size and SHA-256 of every part, and the SHA-256 of the code (``CODE``), by which a page tells whether the code
changed since. The import refuses, in one line, what does not match (the archive's members by their CRC-32), and
swaps the edition in only once all passed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any, Mapping

from .. import paths, runs
from ..numerics import file_sha256
from ..report import book

EDITION = paths.BOOK / "gpu"
"""The committed GPU edition (``import`` installs it; the book renders it)."""
PRESET = "gpu"
"""The only preset whose pack ``import`` accepts."""
MANIFEST = "manifest.json"
ARCHIVE = "edition.zip"
MAX_FILES = 8
"""Files a pack may have, its manifest included: few and small, to travel by any means from a machine without
network."""
MAX_FILE_BYTES = 16 * 2**20
CODE = ("src/diffeqformer", "notebooks", "config")
"""The code an edition was computed by: its files' SHA-256 enter the manifest."""
TOC_PAGE = "book/gpu_edition"
"""The page of ``_toc.yml`` under which ``stage`` lists the edition's notebooks."""
STAGED = "gpu"
"""Where the staged book holds the rendered notebooks: one folder down, as ``notebooks/``, so relative links hold."""


class EditionError(Exception):
    """A pack or an import that cannot be done; the message, one line, names the problem."""


def clock(seconds: float) -> str:
    """``7:42``, or ``1:02:03`` from an hour on."""
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}:{s:02d}" if m < 60 else f"{m // 60}:{m % 60:02d}:{s:02d}"


def code_hashes(repo: Path = paths.REPO) -> dict[str, str]:
    """Path below ``repo`` -> SHA-256 of every source, notebook and config file of ``CODE`` (hidden folders, caches
    left out)."""
    return {f.relative_to(repo).as_posix(): file_sha256(f) for top in CODE for f in sorted((repo / top).rglob("*"))
            if f.is_file() and f.suffix in (".py", ".ipynb", ".yaml", ".yml") and not any(
                p.startswith(".") or p == "__pycache__" for p in f.relative_to(repo).parts)}


def git(*args: str) -> str | None:
    """What ``git ARGS`` prints in the repository, or None without git or a repository."""
    try:
        proc = subprocess.run(["git", "-C", str(paths.REPO), *args], capture_output=True, text=True)
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def collect(preset: str) -> tuple[dict[str, Path | bytes], dict[str, Any]]:
    """What a pack holds of the preset's finished workflow in this ``DIFFEQFORMER_HOME``: path in the pack -> file or
    bytes, and what the manifest says of it (notebooks, date, wall time, the runs' backends)."""
    from .plan import benchmark_seconds, folder, load

    made, work = load(preset), folder(preset)
    files: dict[str, Path | bytes] = {}
    seconds, spans, backends = {}, [], set()
    run_it = (f"run the {preset} workflow's notebooks first (snakemake -s workflow/Snakefile --cores all notebooks "
              f"--config preset={preset})")
    for job in made["notebooks"]:
        nb = job["name"]
        executed, record = work / "notebooks" / f"{nb}.ipynb", work / "records" / f"{nb}.json"
        if not executed.exists() or not record.exists():
            raise EditionError(f"the notebook {nb} has not been executed in {work}: {run_it}")
        if (done := json.loads(record.read_text())).get("parameters") != job["parameters"]:
            raise EditionError(f"the notebook {nb} in {work} was executed with other parameters than the plan's: "
                               f"{run_it}")
        files[f"notebooks/{nb}.ipynb"], files[f"records/{nb}.json"] = executed, record
        files.update({f"figures/{f.name}": f for f in sorted((work / "notebook-figures" / nb).glob("*"))
                      if f.is_file() and f.suffix not in (".png", ".svg")})  # the notebook holds the PNG
        seconds[f"notebook:{nb}"] = done["seconds"]
        spans.append((record, done["seconds"]))
    for unit in made["trainings"]:
        if (bench := work / "benchmarks" / f"train-{unit['name']}.tsv").exists():
            seconds[f"train:{unit['name']}"] = benchmark_seconds(bench)
            spans.append((bench, seconds[f"train:{unit['name']}"]))
        for run_dir in (paths.HOME / r for r in unit["runs"]):
            files.update({f"runs/{run_dir.name}/{name}": run_dir / name
                          for name in (runs.CONFIG, runs.COMPLETE, runs.METRICS) if (run_dir / name).exists()})
            if runs.is_complete(run_dir):
                backends.add(runs.read_complete(run_dir).get("jax_backend", "unknown"))
    ends = [f.stat().st_mtime for f, _ in spans]
    wall = max(ends) - min(end - took for end, (_, took) in zip(ends, spans)) if spans else None
    finished = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(max(ends))) if spans else None
    files["timings.json"] = json.dumps({"wall_s": wall, "finished": finished, "seconds": seconds}, indent=1,
                                       sort_keys=True).encode() + b"\n"
    return files, {"notebooks": [job["name"] for job in made["notebooks"]], "date": finished, "wall_s": wall,
                   "runs": sum(len(u["runs"]) for u in made["trainings"]), "backends": sorted(backends)}


def pack(out: Path, *, preset: str = PRESET, device: str | None = None, commit: str | None = None) -> dict:
    """Pack the preset's workflow of this ``DIFFEQFORMER_HOME`` into ``out`` (emptied first; a folder that holds
    anything but a pack is refused): one zip archive, cut into parts. ``device`` defaults to JAX's, ``commit`` to
    ``DIFFEQFORMER_COMMIT``, else git's. Returns the manifest."""
    files, about = collect(preset)
    out = Path(out)
    if foreign := [f.name for f in (out.iterdir() if out.exists() else ()) if f.name not in (MANIFEST, ARCHIVE)
                   and not f.name.startswith(f"{ARCHIVE}.")]:
        raise EditionError(f"{out} holds {foreign[0]}, which is no part of a pack: name an empty or new folder")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, source in files.items():
            archive.writestr(name, source) if isinstance(source, bytes) else archive.write(source, name)
        largest = max(archive.infolist(), key=lambda info: info.compress_size)
    data = buffer.getvalue()
    chunks = [data[i:i + MAX_FILE_BYTES] for i in range(0, len(data), MAX_FILE_BYTES)]
    if len(chunks) > MAX_FILES - 1:
        raise EditionError(f"the pack's archive has {len(data) / 2**20:.1f} MiB, more than {MAX_FILES - 1} parts of "
                           f"{MAX_FILE_BYTES / 2**20:.0f} MiB and the manifest: its largest file is "
                           f"{largest.filename} ({largest.compress_size / 2**20:.1f} MiB compressed)")
    if not device:
        import jax

        n = len(jax.devices())
        device = f"{jax.devices()[0].device_kind} ({jax.default_backend()}, {n} device{'' if n == 1 else 's'})"
    named = commit or os.environ.get("DIFFEQFORMER_COMMIT")
    status = None if named else git("status", "--porcelain", "--", *CODE)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    parts = []
    for k, chunk in enumerate(chunks, 1):
        (out / f"{ARCHIVE}.{k:03d}").write_bytes(chunk)
        parts.append({"name": f"{ARCHIVE}.{k:03d}", "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"edition": 2, "preset": preset, "device": device, **about,
                "packed": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": named or git("rev-parse", "HEAD") or
                "unknown", "uncommitted": None if status is None else bool(status), "parts": parts,
                "files": list(files), "code": code_hashes()}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _manifest(folder: Path) -> dict:
    """The manifest of the pack in ``folder``, checked to be one."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise EditionError(f"{folder} has no {MANIFEST}: not a pack (python -m diffeqformer.workflow.edition pack "
                           "makes one)") from None
    except ValueError as error:
        raise EditionError(f"{folder / MANIFEST} is corrupt ({type(error).__name__}: {error})") from None
    if not isinstance(manifest, dict) or not {"preset", "parts", "files"} <= set(manifest):
        raise EditionError(f"{folder / MANIFEST} is corrupt: it lacks the preset, the parts or the files")
    return manifest


def check(manifest: Mapping[str, Any], folder: Path) -> zipfile.ZipFile:
    """The pack's archive, once its preset is ``PRESET``, its runs trained on an accelerator, every part has the size
    and SHA-256 the manifest gives it, and it holds every notebook of ``_toc.yml`` and the files listed, no other,
    each at a safe path; else ``EditionError``."""
    from .plan import toc_notebooks

    if manifest["preset"] != PRESET:
        raise EditionError(f"{folder} is an edition of preset {manifest['preset']!r}, not {PRESET!r}: only a "
                           f"{PRESET} pack becomes the GPU edition")
    if cpu := [b for b in manifest.get("backends", []) if b not in ("gpu", "cuda", "rocm", "tpu")]:
        raise EditionError(f"{folder}: its runs trained on {', '.join(cpu)}, not on a GPU")
    chunks = []
    for part in manifest["parts"]:
        if not (path := folder / part["name"]).is_file():
            raise EditionError(f"part {part['name']} is missing from {folder}")
        chunks.append(chunk := path.read_bytes())
        if (len(chunk), digest := hashlib.sha256(chunk).hexdigest()) != (part["bytes"], part["sha256"]):
            raise EditionError(f"part {path} is corrupt: {len(chunk)} bytes and SHA-256 {digest[:12]}..., the "
                               f"manifest's {part['bytes']} bytes and {part['sha256'][:12]}... (truncated or changed "
                               "on the way)")
    if missing := [nb for nb in toc_notebooks() if f"notebooks/{nb}.ipynb" not in manifest["files"]]:
        raise EditionError(f"{folder} lacks the executed notebook(s) {', '.join(missing)} of _toc.yml")
    try:
        archive = zipfile.ZipFile(io.BytesIO(b"".join(chunks)))
    except zipfile.BadZipFile as error:
        raise EditionError(f"the archive of {folder} cannot be read (BadZipFile: {error})") from None
    if odd := sorted(set(archive.namelist()) ^ set(manifest["files"])):
        raise EditionError(f"the archive of {folder} " + (f"lacks {odd[0]!r}, which its manifest lists" if odd[0] in
                           manifest["files"] else f"holds {odd[0]!r}, which its manifest does not list"))
    if unsafe := [n for n in archive.namelist() if n.startswith("/") or ".." in n.split("/") or ":" in n]:
        raise EditionError(f"the archive of {folder} holds the unsafe path {unsafe[0]!r}")
    return archive


def import_edition(source: Path, dest: Path | None = None) -> dict:
    """Check the pack in ``source`` (its folder or its manifest) and install it into ``dest`` (``EDITION``): unpacked
    into a hidden folder beside it, then swapped in; on any error ``dest`` stays as it was (and what a killed import
    left is undone first)."""
    from .jobs import swap_in

    dest, folder = Path(dest or EDITION), Path(source) if Path(source).is_dir() else Path(source).parent
    for left in sorted(dest.parent.glob(f".{dest.name}.*-*")):  # an import's folder, or the edition moved aside
        if left.name.startswith(f".{dest.name}.old-") and not dest.exists():
            os.replace(left, dest)
        shutil.rmtree(left, ignore_errors=True)
    archive = check(manifest := _manifest(folder), folder)
    new = dest.with_name(f".{dest.name}.import-{os.getpid()}")
    try:
        archive.extractall(new)  # reads each member whole, checking its CRC-32
        (new / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        swap_in(new, dest)
    except (zipfile.BadZipFile, zlib.error, EOFError) as error:
        raise EditionError(f"the archive of {folder} cannot be read ({type(error).__name__}: {error})") from None
    finally:
        shutil.rmtree(new, ignore_errors=True)
    return manifest


def load(folder: Path | None = None) -> dict | None:
    """The manifest of the committed edition in ``folder`` (``EDITION``), or None where none is committed."""
    path = Path(folder or EDITION) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def banner(manifest: Mapping[str, Any], repo: Path = paths.REPO) -> str:
    """A MyST admonition for a page's first screen: device, date, commit, preset, wall time, and whether the code
    (``CODE``, by the manifest's SHA-256 of each file) has changed since."""
    wall = clock(manifest["wall_s"]) if manifest.get("wall_s") is not None else "not recorded"
    commit = f"`{manifest.get('commit', 'unknown')[:12]}`" + (
        " with changes not committed" if manifest.get("uncommitted") else "")
    now, then = code_hashes(repo), manifest.get("code", {})
    changed = sorted(f for f in {*now, *then} if now.get(f) != then.get(f))
    shown = ", ".join(f"`{f}`" for f in changed[:4]) + (", ..." if len(changed) > 4 else "")
    line = (f"**This page is older than the code**: {len(changed)} file{'' if len(changed) == 1 else 's'} of the "
            f"code changed since this page was computed ({shown}); it shows what the code of then computed."
            if changed else f"The code (`{'`, `'.join(CODE)}`) has not changed since this page was computed.")
    return "\n".join([
        "```{admonition} GPU edition: executed on a GPU, not by the build of this book",
        f":class: {'warning' if changed else 'note'}", "",
        f"Device **{manifest.get('device', 'unknown')}**, date {manifest.get('date') or 'unknown'}, commit {commit}, "
        f"preset `{manifest.get('preset')}`, workflow wall time {wall}.", "", line, "```", ""])


def edition_notebooks(folder: Path | None = None) -> list[str]:
    """The notebooks of the edition, in ``_toc.yml``'s order (then any other it has)."""
    from .plan import toc_notebooks

    have, order = {p.stem for p in (Path(folder or EDITION) / "notebooks").glob("*.ipynb")}, toc_notebooks()
    return [nb for nb in order if nb in have] + sorted(have - set(order))


def glued_notebooks(folder: Path | None = None) -> dict[str, dict[str, str]] | None:
    """Notebook -> the values it glued, for each notebook of the committed edition; None where none is committed."""
    folder = Path(folder or EDITION)
    return None if load(folder) is None else {
        nb: book.glued(json.loads((folder / "notebooks" / f"{nb}.ipynb").read_text()))
        for nb in edition_notebooks(folder)}


def stage(src: Path, folder: Path | None = None, repo: Path = paths.REPO) -> list[str]:
    """Write the committed edition into the staged book ``src``: each notebook in the reader's view, its title marked
    "(GPU edition)" and ``banner`` below it, as ``gpu/<notebook>.ipynb``, listed under ``TOC_PAGE`` in
    ``src/_toc.yml``. Returns the notebooks staged."""
    import yaml

    folder = Path(folder or EDITION)
    if (manifest := load(folder)) is None:
        return []
    names, text = edition_notebooks(folder), banner(manifest, repo)
    (src / STAGED).mkdir(parents=True, exist_ok=True)
    for nb in names:
        view = book.reader_view(json.loads((folder / "notebooks" / f"{nb}.ipynb").read_text()), text)
        view["cells"][0]["source"] += " (GPU edition)"
        (src / STAGED / f"{nb}.ipynb").write_text(json.dumps(view, indent=1, ensure_ascii=False) + "\n")
    toc = yaml.safe_load((src / "_toc.yml").read_text())
    chapters = [c for part in toc["parts"] for c in part["chapters"] if c["file"] == TOC_PAGE]
    chapters[0]["sections"] = [{"file": f"{STAGED}/{nb}"} for nb in names]
    (src / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.workflow.edition",
                                     description=__doc__.split("\n\n")[0].replace("``", ""))
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack", help="on the GPU machine, after the gpu workflow's notebooks: pack its results into DIR")
    p.add_argument("--out", required=True, type=Path, help="the folder to write (emptied first)")
    p.add_argument("--preset", default=PRESET, help=f"the preset whose workflow to pack (default {PRESET})")
    p.add_argument("--commit", help="the commit of the code (default: $DIFFEQFORMER_COMMIT, else git's)")
    i = verbs.add_parser("import", help="check a pack and install it into book/gpu/")
    i.add_argument("source", type=Path, help="the pack: its folder or its manifest")
    i.add_argument("--into", type=Path, default=EDITION, help=f"where to install it (default {EDITION})")
    args = parser.parse_args(argv)
    try:
        m = pack(args.out, preset=args.preset, commit=args.commit) if args.verb == "pack" else import_edition(
            args.source, args.into)
    except EditionError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"{'packed' if args.verb == 'pack' else 'installed'} the {m['preset']} edition of {m['date']} "
          f"({m['device']}, commit {m['commit'][:12]}): {len(m['files'])} files, {len(m['parts'])} part(s), into "
          f"{args.out if args.verb == 'pack' else args.into}")


if __name__ == "__main__":
    main(sys.argv[1:])
