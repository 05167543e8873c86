"""The GPU edition of the book: what the ``gpu`` preset's workflow made on a GPU machine, packed there, checked and
installed here into ``book/gpu/`` (committed), and shown as the book's part "GPU edition" without executing again::

    python -m diffeqformer.workflow.edition pack --out DIR   # on the GPU machine, after the gpu workflow
    python -m diffeqformer.workflow.edition import DIR       # here: check the pack, then install it into book/gpu/

A pack is ``manifest.json`` and one zip archive cut into at most seven parts of at most 16 MiB (``edition.zip.001``,
...): the executed notebooks (their figures are the PNGs in their outputs), the figures' data (not their images), the
executions' records, each run's config, ``complete.json`` and metrics (no weights). The manifest says the preset,
device, date, commit, wall time and the jobs' seconds, the size and SHA-256 of each part, the SHA-256 of each file
and of the code (``CODE``), by which a page tells whether the code changed since. The import refuses in one line what
does not match (the archive's members by their CRC-32) and swaps the edition in only once all passed.
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
from ..cache import file_sha256
from ..report import book, verdicts

EDITION = paths.BOOK / "gpu"  # the committed edition: import installs it, the book renders it
PRESET = "gpu"  # the only preset whose pack import accepts
MANIFEST, ARCHIVE = "manifest.json", "edition.zip"
MAX_FILES, MAX_FILE_BYTES = 8, 16 * 2**20  # a pack's files, its manifest included: to travel by any means
CODE = ("src/diffeqformer", "notebooks", "config")  # the code an edition was computed by: its SHA-256 in the manifest
TOC_PAGE = "book/gpu_edition"  # the page of _toc.yml under which stage lists the edition's notebooks
STAGED = "gpu"  # the staged book's folder of the edition's notebooks: beside notebooks/, so relative links hold


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
    proc = shutil.which("git") and subprocess.run(["git", "-C", str(paths.REPO), *args], capture_output=True, text=True)
    return proc.stdout.strip() if proc and proc.returncode == 0 else None


def collect(preset: str) -> tuple[dict[str, Path], dict[str, Any]]:
    """What a pack holds of the preset's finished workflow in this ``DIFFEQFORMER_HOME``: path in the pack -> file,
    and what the manifest says of it (notebooks, date, wall time, each job's seconds, the runs' backends)."""
    from .plan import benchmark_seconds, folder, load

    made, work = load(preset), folder(preset)
    files: dict[str, Path] = {}
    seconds, spans, backends = {}, [], set()  # spans: (the file a job wrote last, the job's seconds)
    for job in made["notebooks"]:
        nb = job["name"]
        executed, record = work / "notebooks" / f"{nb}.ipynb", work / "records" / f"{nb}.json"
        done = json.loads(record.read_text()) if executed.exists() and record.exists() else {}
        if done.get("parameters") != job["parameters"]:
            raise EditionError(f"the notebook {nb} has not been executed in {work} as the plan says: run the {preset} "
                               f"workflow's notebooks first (snakemake -s workflow/Snakefile --cores all notebooks "
                               f"--config preset={preset})")
        files[f"notebooks/{nb}.ipynb"], files[f"records/{nb}.json"] = executed, record
        files.update({f"figures/{f.name}": f for f in sorted((work / "notebook-figures" / nb).glob("*"))
                      if f.is_file() and f.suffix not in (".png", ".svg")})  # the notebook holds the PNG
        spans.append((record, seconds.setdefault(f"notebook:{nb}", done["seconds"])))
    for unit in made["trainings"]:
        if (bench := work / "benchmarks" / f"train-{unit['name']}.tsv").exists():
            spans.append((bench, seconds.setdefault(f"train:{unit['name']}", benchmark_seconds(bench))))
        for run_dir in (paths.HOME / r for r in unit["runs"]):
            files.update({f"runs/{run_dir.name}/{name}": run_dir / name
                          for name in (runs.CONFIG, runs.COMPLETE, runs.METRICS) if (run_dir / name).exists()})
            if runs.is_complete(run_dir):
                backends.add(runs.read_complete(run_dir).get("jax_backend", "unknown"))
    end = max(f.stat().st_mtime for f, _ in spans)  # from the first job's start to the last one's end
    wall = end - min(f.stat().st_mtime - took for f, took in spans)
    return files, {"notebooks": [job["name"] for job in made["notebooks"]], "wall_s": wall,
                   "date": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(end)),
                   "seconds": seconds, "runs": sum(len(u["runs"]) for u in made["trainings"]),
                   "backends": sorted(backends)}


def pack(out: Path, *, preset: str = PRESET, device: str | None = None, commit: str | None = None) -> dict:
    """Pack the preset's workflow of this ``DIFFEQFORMER_HOME`` into ``out`` (emptied first; a folder that holds
    anything but a pack is refused). ``device`` defaults to JAX's, ``commit`` to ``DIFFEQFORMER_COMMIT``, else git's.
    Returns the manifest."""
    files, about = collect(preset)
    out = Path(out)
    if foreign := [f.name for f in (out.iterdir() if out.exists() else ()) if f.name != MANIFEST
                   and not f.name.startswith(f"{ARCHIVE}.")]:
        raise EditionError(f"{out} holds {foreign[0]}, which is no part of a pack: name an empty or new folder")
    with zipfile.ZipFile(buffer := io.BytesIO(), "w", zipfile.ZIP_DEFLATED) as archive:
        for name, source in files.items():
            archive.write(source, name)
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
    parts = [{"name": f"{ARCHIVE}.{k:03d}", "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()}
             for k, chunk in enumerate(chunks, 1)]
    for part, chunk in zip(parts, chunks):
        (out / part["name"]).write_bytes(chunk)
    manifest = {"preset": preset, "device": device, **about, "commit": named or git("rev-parse", "HEAD") or "unknown",
                "uncommitted": None if status is None else bool(status), "parts": parts,
                "files": {name: file_sha256(source) for name, source in files.items()}, "code": code_hashes()}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check(folder: Path) -> tuple[dict, bytes]:
    """The manifest of the pack in ``folder`` and its archive's bytes, once its preset is ``PRESET``, its runs trained
    on an accelerator, it lists every notebook of ``_toc.yml``, and every part has the size and SHA-256 the manifest
    gives it; else ``EditionError``."""
    from .plan import toc_notebooks

    if not (folder / MANIFEST).is_file():
        raise EditionError(f"{folder} has no {MANIFEST}: not a pack (python -m diffeqformer.workflow.edition pack "
                           "makes one)")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        preset, listed = manifest["preset"], manifest["files"]
    except (ValueError, KeyError, TypeError) as error:
        raise EditionError(f"{folder / MANIFEST} is corrupt ({type(error).__name__}: {error})") from None
    if preset != PRESET:
        raise EditionError(f"{folder} is an edition of preset {preset!r}, not {PRESET!r}: only a {PRESET} pack "
                           "becomes the GPU edition")
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
    if missing := [nb for nb in toc_notebooks() if f"notebooks/{nb}.ipynb" not in listed]:
        raise EditionError(f"{folder} lacks the executed notebook(s) {', '.join(missing)} of _toc.yml")
    return manifest, b"".join(chunks)


def import_edition(source: Path, dest: Path | None = None) -> dict:
    """Check the pack in ``source`` (its folder or its manifest, ``check``) and install it into ``dest``
    (``EDITION``): its archive, holding the files the manifest lists, no other, each at a safe path, is unpacked into a
    hidden folder beside it, then swapped in; on any error ``dest`` stays as it was (and what a killed import left is
    undone first)."""
    from .jobs import swap_in

    dest, folder = Path(dest or EDITION), Path(source).parent if Path(source).is_file() else Path(source)
    for left in sorted(dest.parent.glob(f".{dest.name}.*-*")):  # an import's folder, or the edition moved aside
        if left.name.startswith(f".{dest.name}.old-") and not dest.exists():
            os.replace(left, dest)
        shutil.rmtree(left, ignore_errors=True)
    manifest, data = check(folder)
    new = dest.with_name(f".{dest.name}.import-{os.getpid()}")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        if odd := sorted(set(archive.namelist()) ^ set(listed := manifest["files"])):
            raise EditionError(f"the archive of {folder} " + (f"lacks {odd[0]!r}, which its manifest lists" if odd[0]
                               in listed else f"holds {odd[0]!r}, which its manifest does not list"))
        if unsafe := [n for n in listed if n.startswith("/") or ".." in n.split("/") or ":" in n]:
            raise EditionError(f"the archive of {folder} holds the unsafe path {unsafe[0]!r}")
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
    commit = f"`{manifest['commit'][:12]}`" + (" with changes not committed" if manifest.get("uncommitted") else "")
    now, then = code_hashes(repo), manifest["code"]
    changed = sorted(f for f in {*now, *then} if now.get(f) != then.get(f))
    shown = ", ".join(f"`{f}`" for f in changed[:4]) + (", ..." if len(changed) > 4 else "")
    line = (f"**This page is older than the code**: {len(changed)} file{'' if len(changed) == 1 else 's'} of the "
            f"code changed since this page was computed ({shown}); it shows what the code of then computed."
            if changed else f"The code (`{'`, `'.join(CODE)}`) has not changed since this page was computed.")
    return "\n".join([
        "```{admonition} GPU edition: executed on a GPU, not by the build of this book",
        f":class: {'warning' if changed else 'note'}", "", f"Device **{manifest['device']}**, date "
        f"{manifest['date'] or 'unknown'}, commit {commit}, preset `{manifest['preset']}`, workflow wall time {wall}.",
        "", line, "```", ""])


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
    "(GPU edition)", ``banner`` and its verdicts (Holm-adjusted across the edition's claims) below it, as
    ``gpu/<notebook>.ipynb``, listed under ``TOC_PAGE`` in ``src/_toc.yml``. Returns the notebooks staged."""
    import yaml

    folder = Path(folder or EDITION)
    if (manifest := load(folder)) is None:
        return []
    names, text = edition_notebooks(folder), banner(manifest, repo)
    judged = verdicts.holm_verdicts(glued_notebooks(folder))
    (src / STAGED).mkdir(parents=True, exist_ok=True)
    for nb in names:
        opening = "\n".join(filter(None, [text, verdicts.opening_markdown(nb, judged, manifest["preset"])]))
        view = book.reader_view(json.loads((folder / "notebooks" / f"{nb}.ipynb").read_text()), opening)
        view["cells"][0]["source"] += " (GPU edition)"
        (src / STAGED / f"{nb}.ipynb").write_text(json.dumps(view, indent=1, ensure_ascii=False) + "\n")
    toc = yaml.safe_load((src / "_toc.yml").read_text())
    page = next(c for part in toc["parts"] for c in part["chapters"] if c["file"] == TOC_PAGE)
    page["sections"] = [{"file": f"{STAGED}/{nb}"} for nb in names]
    (src / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.workflow.edition",
                                     description=__doc__.split("\n\n")[0].replace("``", ""))
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack", help="on the GPU machine, after the gpu workflow's notebooks: pack its results")
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
