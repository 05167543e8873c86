"""The GPU edition of the book: what the ``gpu`` preset's workflow made on a GPU machine,
packed there, checked and installed here into ``book/gpu/`` (committed), and shown as the book's part "GPU edition"
without executing anything again::

    python -m diffeqformer.workflow.edition pack --out DIR   # on the GPU machine, after the gpu workflow
    python -m diffeqformer.workflow.edition import DIR       # here: check the pack, then install it into book/gpu/

**Pack** reads the preset's workflow folder (``plan.folder``: each executed notebook with its figures and record,
the trainings' benchmarks) and its runs, and writes ``manifest.json`` and at most seven zip parts beside it, each at most 16 MiB: the executed notebooks (their
figures are the PNGs embedded in their outputs), each notebook's figure data and tables (the figures' JSON
provenance, CSV tables; not their PNG and SVG files), the records of the executions, each run's resolved
``config.yaml``, ``complete.json`` and ``metrics.jsonl`` (no model weights, no checkpoint) and the jobs'
timings. The manifest says the preset, the device as JAX reports it, the date, the commit of the code, the
workflow's wall time, every file with its size, part and SHA-256, and the SHA-256 of every file of the code
(``CODE``), by which a page tells whether the code has changed since.

**Import** refuses, in one line naming the problem, a pack of another preset, a part whose size or SHA-256 is not
the manifest's (truncated or changed on the way), a file that does not match, a notebook of ``_toc.yml`` that is
missing, or runs trained on a CPU; it unpacks into a hidden folder beside ``book/gpu/`` and swaps that in only
when everything has passed, so that a failed import leaves the committed edition as it was (and the next import
puts it back if one was killed between the swap's two renames).

**Render**: ``stage`` writes each notebook of the committed edition into the staged book (``gpu/<notebook>``) with
a banner on its first screen (``banner``: device, date, commit, preset, wall time, and whether the code changed
since) and lists them in the staged ``_toc.yml`` under the page ``book/gpu_edition``; that page
(``pages.gpu_edition_markdown``) says that no GPU edition exists yet, and how to make one, when none is committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from pathlib import Path
from typing import Any, Mapping

from .. import paths, runs
from ..numerics import file_sha256
from ..report import book

EDITION = paths.BOOK / "gpu"
"""The committed GPU edition: ``manifest.json``, ``notebooks/``, ``figures/``, ``records/``, ``runs/``,
``timings.json`` (``import`` installs it; the book renders it)."""
PRESET = "gpu"
"""The only preset whose pack ``import`` accepts."""
MANIFEST = "manifest.json"
MAX_FILES = 8
"""Files a pack may have, the manifest included: few and small, so that the pack travels by any means (an upload
form, a size-limited transfer) from a GPU machine without network."""
MAX_FILE_BYTES = 16 * 2**20
"""Bytes a file of a pack may have (``MAX_FILES``)."""
CODE = ("src/diffeqformer", "notebooks", "config")
"""The code an edition was computed by, below the repository: its files' SHA-256 enter the manifest."""
CODE_SUFFIXES = (".py", ".ipynb", ".yaml", ".yml")
TOC_PAGE = "book/gpu_edition"
"""The page of ``_toc.yml`` under which ``stage`` lists the edition's notebooks."""
STAGED = "gpu"
"""Where ``stage`` writes the rendered notebooks in the staged book: beside ``notebooks/``, one folder down, so that
a notebook's relative links (``../book/model``) lead where they lead from its own page."""
RUN_FILES = (runs.CONFIG, runs.COMPLETE, runs.METRICS)
"""What a pack keeps of each run: no weights, no checkpoint."""
SKIPPED_FIGURE_FILES = (".png", ".svg")
"""A figure's image files stay out of a pack: the executed notebook holds its PNG."""


def clock(seconds: float) -> str:
    """``7:42``, or ``1:02:03`` from an hour on."""
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else \
        f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class EditionError(Exception):
    """A pack or an import that cannot be done; the message, one line, names the problem."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------------------------ pack


def code_hashes(repo: Path = paths.REPO) -> dict[str, str]:
    """Path below ``repo`` -> SHA-256 of every source, notebook and config file of ``CODE`` (caches and hidden
    folders left out)."""
    found = {}
    for top in CODE:
        for f in sorted((repo / top).rglob("*")):
            rel = f.relative_to(repo)
            if f.is_file() and f.suffix in CODE_SUFFIXES and not any(
                    part.startswith(".") or part == "__pycache__" for part in rel.parts):
                found[rel.as_posix()] = file_sha256(f)
    return found


def git_commit(repo: Path = paths.REPO) -> str | None:
    """The commit checked out in ``repo``, or None without git or a repository (a copy of the working tree
    on the GPU machine may have none)."""
    try:
        proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def uncommitted_code(repo: Path = paths.REPO) -> bool | None:
    """Whether ``CODE`` has changes that are not committed (``git status``), or None without git or a repository."""
    try:
        proc = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", *CODE], capture_output=True,
                              text=True)
    except OSError:
        return None
    return bool(proc.stdout.strip()) if proc.returncode == 0 else None


def jax_device() -> str:
    """The device as JAX reports it: ``NVIDIA H100 80GB HBM3 (gpu, 1 device)``."""
    import jax

    devices = jax.devices()
    count = f"{len(devices)} device{'' if len(devices) == 1 else 's'}"
    return f"{devices[0].device_kind} ({jax.default_backend()}, {count})"


def collect(preset: str) -> tuple[dict[str, Path | bytes], dict[str, Any]]:
    """What a pack holds of the preset's workflow in this ``DIFFEQFORMER_HOME`` (every notebook executed): path in
    the pack -> file or bytes, and what the manifest says of it (notebooks, date, wall time, the runs' backends)."""
    from .plan import benchmark_seconds, folder, load

    made, work = load(preset), folder(preset)
    files: dict[str, Path | bytes] = {}
    spans, seconds = [], {}
    for job in made["notebooks"]:
        nb = job["name"]
        executed, record = work / "notebooks" / f"{nb}.ipynb", work / "records" / f"{nb}.json"
        if not executed.exists() or not record.exists():
            raise EditionError(f"the notebook {nb} has not been executed in {work}: run the {preset} workflow's "
                               f"notebooks first (snakemake -s workflow/Snakefile --cores all notebooks --config "
                               f"preset={preset})")
        if json.loads(record.read_text()).get("parameters") != job["parameters"]:
            raise EditionError(f"the notebook {nb} in {work} was executed with other parameters than the plan's "
                               f"(a workflow cut short?): run the {preset} workflow's notebooks again")
        files[f"notebooks/{nb}.ipynb"], files[f"records/{nb}.json"] = executed, record
        for f in sorted((work / "notebook-figures" / nb).glob("*")):
            if f.is_file() and f.suffix not in SKIPPED_FIGURE_FILES:
                files[f"figures/{f.name}"] = f
        seconds[f"notebook:{nb}"] = took = json.loads(record.read_text())["seconds"]
        spans.append((record.stat().st_mtime - took, record.stat().st_mtime))
    backends = set()
    for unit in made["trainings"]:
        bench = work / "benchmarks" / f"train-{unit['name']}.tsv"
        if bench.exists():
            seconds[f"train:{unit['name']}"] = took = benchmark_seconds(bench)
            spans.append((bench.stat().st_mtime - took, bench.stat().st_mtime))
        for run_dir in (paths.HOME / r for r in unit["runs"]):
            for name in RUN_FILES:
                if (run_dir / name).exists():
                    files[f"runs/{run_dir.name}/{name}"] = run_dir / name
            if runs.is_complete(run_dir):
                backends.add(runs.read_complete(run_dir).get("jax_backend", "unknown"))
    wall = max(e for _, e in spans) - min(b for b, _ in spans) if spans else None
    finished = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(max(e for _, e in spans))) if spans else None
    files["timings.json"] = (json.dumps({"wall_s": wall, "finished": finished, "seconds": seconds}, indent=1,
                                        sort_keys=True) + "\n").encode()
    about = {"notebooks": [job["name"] for job in made["notebooks"]], "date": finished, "wall_s": wall,
             "runs": sum(len(u["runs"]) for u in made["trainings"]), "backends": sorted(backends)}
    return files, about


def _write_parts(files: Mapping[str, Path | bytes], out: Path) -> tuple[list[dict], list[dict]]:
    """Zip ``files`` into ``edition-K.zip`` parts of at most ``MAX_FILE_BYTES`` each, in order, a new part when the
    next file's compressed size would not fit; returns the parts' and the files' manifest entries."""
    parts: list[dict] = []
    entries: list[dict] = []
    archive = None
    size = 0
    try:
        for name, source in files.items():
            data = source if isinstance(source, bytes) else Path(source).read_bytes()
            cost = len(zlib.compress(data, 6)) + 2 * len(name) + 200  # the local header and the central directory's
            if cost > MAX_FILE_BYTES - 1024:
                raise EditionError(f"{name} ({source}) compresses to {cost / 2**20:.1f} MiB, more than a pack's "
                                   f"{MAX_FILE_BYTES / 2**20:.0f} MiB a file")
            if archive is None or size + cost > MAX_FILE_BYTES - 1024:
                if archive is not None:
                    archive.close()
                parts.append({"name": f"edition-{len(parts) + 1}.zip"})
                archive = zipfile.ZipFile(out / parts[-1]["name"], "w", zipfile.ZIP_DEFLATED, compresslevel=6)
                size = 22
            archive.writestr(name, data)
            size += cost
            entries.append({"path": name, "bytes": len(data), "sha256": _sha256(data), "part": parts[-1]["name"]})
    finally:
        if archive is not None:
            archive.close()
    for part in parts:
        path = out / part["name"]
        part.update(bytes=path.stat().st_size, sha256=file_sha256(path))
    return parts, entries


def pack(out: Path, *, preset: str = PRESET, device: str | None = None, commit: str | None = None) -> dict:
    """Pack the preset's workflow of this ``DIFFEQFORMER_HOME`` into ``out`` (emptied first; a folder
    that holds anything but a pack is refused): ``manifest.json`` and the zip parts (module docstring). ``device``
    defaults to JAX's (``jax_device``), ``commit`` to ``DIFFEQFORMER_COMMIT``, else git's. Refuses, naming the file,
    a pack of more than ``MAX_FILES`` files or a file over ``MAX_FILE_BYTES``. Returns the manifest."""
    files, about = collect(preset)
    out = Path(out)
    if out.exists():
        foreign = [f.name for f in out.iterdir() if f.name != MANIFEST and not f.name.startswith("edition-")]
        if foreign:
            raise EditionError(f"{out} holds {foreign[0]}, which is no part of a pack: name an empty or new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    parts, entries = _write_parts(files, out)
    if len(parts) + 1 > MAX_FILES:
        shutil.rmtree(out)
        over = parts[MAX_FILES - 1]["name"]
        first = next(e["path"] for e in entries if e["part"] == over)
        raise EditionError(f"the pack needs {len(parts)} parts and its manifest, more than {MAX_FILES} files: "
                           f"{over} (from {first} on) is one too many")
    named = commit or os.environ.get("DIFFEQFORMER_COMMIT")
    manifest = {"edition": 1, "preset": preset, "device": device or jax_device(), **about,
                "packed": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": named or git_commit() or "unknown",
                "uncommitted": None if named else uncommitted_code(), "parts": parts, "files": entries,
                "code": code_hashes()}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    for f in sorted(out.iterdir()):
        if f.stat().st_size > MAX_FILE_BYTES:
            raise EditionError(f"{f} has {f.stat().st_size / 2**20:.1f} MiB, more than "
                               f"{MAX_FILE_BYTES / 2**20:.0f} MiB")
    return manifest


# ---------------------------------------------------------------------------------------------------------- import


def _read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.exists():
        raise EditionError(f"{folder} has no {MANIFEST}: not a pack (python -m diffeqformer.workflow.edition pack "
                           "makes one)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EditionError(f"{path} is corrupt ({type(error).__name__}: {error})") from None
    if not isinstance(manifest, dict) or not {"preset", "parts", "files"} <= set(manifest):
        raise EditionError(f"{path} is corrupt: it lacks the preset, the parts or the files")
    return manifest


def check_manifest(manifest: Mapping[str, Any], folder: Path) -> None:
    """The pack's preset is ``PRESET``, its runs trained on an accelerator, every part has the size and SHA-256 the
    manifest gives it, and every notebook of ``_toc.yml`` is in it; else ``EditionError``."""
    from .plan import toc_notebooks

    if manifest.get("preset") != PRESET:
        raise EditionError(f"{folder} is an edition of preset {manifest.get('preset')!r}, not {PRESET!r}: only a "
                           f"{PRESET} pack becomes the GPU edition")
    cpu = [b for b in manifest.get("backends", []) if b not in ("gpu", "cuda", "rocm", "tpu")]
    if cpu:
        raise EditionError(f"{folder}: its runs trained on {', '.join(cpu)}, not on a GPU")
    for part in manifest["parts"]:
        path = folder / part["name"]
        if not path.is_file():
            raise EditionError(f"part {part['name']} is missing from {folder}")
        size = path.stat().st_size
        if size != part["bytes"] or file_sha256(path) != part["sha256"]:
            raise EditionError(f"part {path} is corrupt: {size} bytes and SHA-256 {file_sha256(path)[:12]}..., the "
                               f"manifest's {part['bytes']} bytes and {part['sha256'][:12]}... (truncated or changed "
                               "on the way)")
    names = {Path(f["path"]).stem for f in manifest["files"] if f["path"].startswith("notebooks/")}
    missing = [nb for nb in toc_notebooks() if nb not in names]
    if missing:
        raise EditionError(f"{folder} lacks the executed notebook(s) {', '.join(missing)} of _toc.yml")


def _safe(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts


def unpack(manifest: Mapping[str, Any], folder: Path, dest: Path) -> None:
    """Extract every file of the manifest from its part in ``folder`` into ``dest``, each checked against its
    SHA-256; a file outside the manifest, missing, or with an unsafe path is refused."""
    listed = {f["path"]: f for f in manifest["files"]}
    seen = set()
    for part in manifest["parts"]:
        try:
            with zipfile.ZipFile(folder / part["name"]) as archive:
                for info in archive.infolist():
                    if info.filename not in listed or not _safe(info.filename):
                        raise EditionError(f"part {part['name']} holds {info.filename!r}, which its manifest does "
                                           "not list")
                    data = archive.read(info)
                    if _sha256(data) != listed[info.filename]["sha256"]:
                        raise EditionError(f"{info.filename} in part {part['name']} does not match its SHA-256")
                    (dest / info.filename).parent.mkdir(parents=True, exist_ok=True)
                    (dest / info.filename).write_bytes(data)
                    seen.add(info.filename)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as error:
            raise EditionError(f"part {part['name']} cannot be read ({type(error).__name__}: {error})") from None
    missing = sorted(set(listed) - seen)
    if missing:
        raise EditionError(f"{len(missing)} file(s) of the manifest are in no part: {', '.join(missing[:3])}")


def _pack_folder(source: Path, scratch: Path) -> Path:
    """The folder that holds the pack: ``source`` itself, the folder of a file of it (its manifest or a part), or,
    for an archive of the whole pack (zip or tar), where it unpacks in ``scratch``."""
    if source.is_dir():
        return source
    if not source.exists():
        raise EditionError(f"{source} does not exist")
    if source.name == MANIFEST or (source.parent / MANIFEST).exists():
        return source.parent
    try:
        shutil.unpack_archive(source, scratch)
    except (shutil.ReadError, ValueError, zipfile.BadZipFile, EOFError, OSError) as error:
        raise EditionError(f"{source} cannot be unpacked ({type(error).__name__}: {error})") from None
    found = sorted(scratch.rglob(MANIFEST))
    if not found:
        raise EditionError(f"{source} holds no {MANIFEST}: not a pack")
    return found[0].parent


def _recover(dest: Path) -> None:
    """Undo what an import killed midway left beside ``dest``: its unpacked folder, and, if it was killed between
    the two renames of the swap, the previous edition, which is put back."""
    for stale in dest.parent.glob(f".{dest.name}.import-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for old in sorted(dest.parent.glob(f".{dest.name}.old-*")):
        if not dest.exists():
            os.replace(old, dest)
        else:
            shutil.rmtree(old, ignore_errors=True)


def import_edition(source: Path, dest: Path | None = None) -> dict:
    """Check the pack at ``source`` (a folder, a file in it, or an archive of it) and install it into ``dest``
    (``EDITION``): unpacked into a hidden folder beside it, then swapped in; on any error ``dest`` is left as it
    was. Returns the manifest."""
    dest = Path(dest or EDITION)
    _recover(dest)
    with tempfile.TemporaryDirectory() as scratch:
        folder = _pack_folder(Path(source), Path(scratch))
        manifest = _read_manifest(folder)
        check_manifest(manifest, folder)
        dest.parent.mkdir(parents=True, exist_ok=True)
        new = dest.with_name(f".{dest.name}.import-{os.getpid()}")
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir()
        try:
            unpack(manifest, folder, new)
            (new / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
            if dest.exists():
                os.replace(dest, old)
            os.replace(new, dest)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(new, ignore_errors=True)
    return manifest


# ---------------------------------------------------------------------------------------------------------- render


def load(folder: Path | None = None) -> dict | None:
    """The manifest of the committed edition in ``folder`` (``EDITION``), or None where none is committed."""
    path = Path(folder or EDITION) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def changed_code(manifest: Mapping[str, Any], repo: Path = paths.REPO) -> tuple[list[str] | None, str]:
    """The files of ``CODE`` that differ from those the edition was computed by (changed, added or removed), found
    by the manifest's SHA-256 of each, else by ``git diff`` from its commit; ``(None, why)`` where neither can tell."""
    if manifest.get("code"):
        now = code_hashes(repo)
        then = manifest["code"]
        return sorted(f for f in set(now) | set(then) if now.get(f) != then.get(f)), ""
    commit = manifest.get("commit", "unknown")
    if commit == "unknown":
        return None, "the edition records neither its commit nor its code"
    try:
        proc = subprocess.run(["git", "-C", str(repo), "diff", "--name-only", commit, "--", *CODE],
                              capture_output=True, text=True)
    except OSError:
        return None, "git is not installed"
    if proc.returncode != 0:
        return None, f"git cannot compare with that commit: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return sorted(proc.stdout.split()), ""


def staleness(manifest: Mapping[str, Any], repo: Path = paths.REPO) -> str:
    """One sentence: whether the code has changed since the edition was computed (``changed_code``)."""
    commit = f"`{manifest.get('commit', 'unknown')[:12]}`"
    changed, why = changed_code(manifest, repo)
    since = "since this page was computed" if manifest.get("code") else f"since commit {commit}"
    if changed is None:
        return f"Whether the code has changed since commit {commit} cannot be told here ({why})."
    if not changed:
        return f"The code (`{'`, `'.join(CODE)}`) has not changed {since}."
    shown = ", ".join(f"`{f}`" for f in changed[:4]) + (", ..." if len(changed) > 4 else "")
    return (f"**This page is older than the code**: {len(changed)} file{'' if len(changed) == 1 else 's'} of the code "
            f"changed {since} ({shown}); it shows what the code of then computed.")


def banner(manifest: Mapping[str, Any], repo: Path = paths.REPO) -> str:
    """A MyST admonition for a page's first screen: device, date, commit, preset, the workflow's wall time, and
    ``staleness``."""
    wall = clock(manifest["wall_s"]) if manifest.get("wall_s") is not None else "not recorded"
    commit = f"`{manifest.get('commit', 'unknown')[:12]}`"
    if manifest.get("uncommitted"):
        commit += " with changes not committed"
    line = staleness(manifest, repo)
    kind = "warning" if line.startswith("**This page is older") else "note"
    return "\n".join([
        "```{admonition} GPU edition: executed on a GPU, not by the build of this book", f":class: {kind}", "",
        f"Device **{manifest.get('device', 'unknown')}**, date {manifest.get('date') or 'unknown'}, commit {commit}, "
        f"preset `{manifest.get('preset')}`, workflow wall time {wall}.", "", line, "```", ""])


def render_notebook(nb: dict, manifest: Mapping[str, Any], repo: Path = paths.REPO) -> dict:
    """The executed notebook ``nb`` (its JSON, changed in place and returned) as the GPU edition shows it: the
    reader's view (``report.book.reader_view``), its title marked "(GPU edition)" and ``banner`` right below it."""
    nb = book.reader_view(nb)
    text = banner(manifest, repo)
    first = next((c for c in nb["cells"] if c["cell_type"] == "markdown"), None)
    source = "".join(first["source"]) if first else ""
    if first is not None and source.startswith("# "):
        title, _, rest = source.partition("\n")
        first["source"] = f"{title} (GPU edition)\n\n{text}\n" + rest.lstrip("\n")
    else:
        nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": text})
    return nb


def edition_notebooks(folder: Path | None = None) -> list[str]:
    """The notebooks of the edition, in ``_toc.yml``'s order (then any other it has)."""
    from .plan import toc_notebooks

    folder = Path(folder or EDITION)
    have = {p.stem for p in (folder / "notebooks").glob("*.ipynb")}
    order = toc_notebooks()
    return [nb for nb in order if nb in have] + sorted(have - set(order))


def glued_notebooks(folder: Path | None = None) -> dict[str, dict[str, str]] | None:
    """Notebook -> the values it glued (``report.book.glued``), for each notebook of the committed edition in
    ``folder`` (``EDITION``); None where none is committed."""
    folder = Path(folder or EDITION)
    if load(folder) is None:
        return None
    return {nb: book.glued(json.loads((folder / "notebooks" / f"{nb}.ipynb").read_text()))
            for nb in edition_notebooks(folder)}


def stage(src: Path, folder: Path | None = None, repo: Path = paths.REPO) -> list[str]:
    """Write the committed edition of ``folder`` (``EDITION``) into the staged book ``src``: each notebook rendered
    (``render_notebook``) as ``gpu/<notebook>.ipynb``, listed under ``TOC_PAGE`` in ``src/_toc.yml`` (where that
    page is in it). Nothing where no edition is committed. Returns the notebooks staged."""
    import yaml

    folder = Path(folder or EDITION)
    manifest = load(folder)
    if manifest is None:
        return []
    names = edition_notebooks(folder)
    (src / STAGED).mkdir(parents=True, exist_ok=True)
    for nb in names:
        rendered = render_notebook(json.loads((folder / "notebooks" / f"{nb}.ipynb").read_text()), manifest, repo)
        (src / STAGED / f"{nb}.ipynb").write_text(json.dumps(rendered, indent=1, ensure_ascii=False) + "\n")
    toc = yaml.safe_load((src / "_toc.yml").read_text())

    def walk(node):
        if isinstance(node, dict):
            if node.get("file") == TOC_PAGE:
                node["sections"] = [{"file": f"{STAGED}/{nb}"} for nb in names]
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(toc)
    (src / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False))
    return names


# ------------------------------------------------------------------------------------------------------ command


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.workflow.edition",
                                     description=__doc__.split("\n\n")[0].replace("``", ""))
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack", help="on the GPU machine, after the gpu workflow's notebooks: pack its results into DIR")
    p.add_argument("--out", required=True, type=Path, help="the folder to write (emptied first)")
    p.add_argument("--preset", default=PRESET, help=f"the preset whose workflow to pack (default {PRESET})")
    p.add_argument("--commit", help="the commit of the code (default: $DIFFEQFORMER_COMMIT, else git's)")
    i = verbs.add_parser("import", help="check a pack and install it into book/gpu/")
    i.add_argument("source", type=Path, help="the pack: its folder, its manifest, or an archive of it")
    i.add_argument("--into", type=Path, default=EDITION, help=f"where to install it (default {EDITION})")
    args = parser.parse_args(argv)
    try:
        if args.verb == "pack":
            m = pack(args.out, preset=args.preset, commit=args.commit)
            print(f"packed the {m['preset']} workflow of {m['date']} on {m['device']}, commit {m['commit'][:12]}: "
                  f"{len(m['files'])} files in {len(m['parts'])} part(s), "
                  f"{sum(p['bytes'] for p in m['parts']) / 2**20:.1f} MiB, into {args.out}")
        else:
            m = import_edition(args.source, args.into)
            print(f"installed the GPU edition of {m['date']} ({m['device']}, commit {m['commit'][:12]}): "
                  f"{len(m['files'])} files into {args.into}")
    except EditionError as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main(sys.argv[1:])
