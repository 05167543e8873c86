"""The GPU edition of the book: what the ``gpu`` preset's workflow made on a GPU machine, packed there, checked and
installed here into ``book/gpu/`` (committed), and shown as the book's part "GPU edition" without executing again::

    python -m diffeqformer.workflow.edition pack --out DIR   # on the GPU machine, after the gpu workflow
    python -m diffeqformer.workflow.edition import DIR       # here: check the pack, then install it into book/gpu/

A pack is ``manifest.json`` and at most seven zip parts of at most 16 MiB: the executed notebooks (their figures are
the PNGs in their outputs), the figures' data (not their images), the executions' records, each run's config,
``complete.json`` and metrics (no weights), the jobs' timings. The manifest says the preset, device, date, commit and
wall time, and the SHA-256 of every packed file and of the code (``CODE``), by which a page tells whether the code
changed since. The import refuses, in one line, what does not match, and swaps the edition in only once all passed.
"""

from __future__ import annotations

import argparse
import contextlib
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
"""The committed GPU edition (``import`` installs it; the book renders it)."""
PRESET = "gpu"
"""The only preset whose pack ``import`` accepts."""
MANIFEST = "manifest.json"
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


def clock(seconds: float) -> str:
    """``7:42``, or ``1:02:03`` from an hour on."""
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}:{s:02d}" if m < 60 else f"{m // 60}:{m % 60:02d}:{s:02d}"


class EditionError(Exception):
    """A pack or an import that cannot be done; the message, one line, names the problem."""


def code_hashes(repo: Path = paths.REPO) -> dict[str, str]:
    """Path below ``repo`` -> SHA-256 of every source, notebook and config file of ``CODE`` (hidden folders, caches
    left out)."""
    return {f.relative_to(repo).as_posix(): file_sha256(f) for top in CODE for f in sorted((repo / top).rglob("*"))
            if f.is_file() and f.suffix in (".py", ".ipynb", ".yaml", ".yml") and not any(
                p.startswith(".") or p == "__pycache__" for p in f.relative_to(repo).parts)}


def _git(*args: str, repo: Path = paths.REPO) -> subprocess.CompletedProcess | None:
    """``git -C repo ARGS``, or None where git is not installed."""
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    except OSError:
        return None


def git_commit(repo: Path = paths.REPO) -> str | None:
    """The commit checked out in ``repo``, or None without git or a repository."""
    proc = _git("rev-parse", "HEAD", repo=repo)
    return proc.stdout.strip() if proc and proc.returncode == 0 else None


def collect(preset: str) -> tuple[dict[str, Path | bytes], dict[str, Any]]:
    """What a pack holds of the preset's finished workflow in this ``DIFFEQFORMER_HOME``: path in the pack -> file or
    bytes, and what the manifest says of it (notebooks, date, wall time, the runs' backends)."""
    from .plan import benchmark_seconds, folder, load

    made, work = load(preset), folder(preset)
    files: dict[str, Path | bytes] = {}
    spans, seconds, backends = [], {}, set()
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
        files.update({f"figures/{f.name}": f for f in sorted((work / "notebook-figures" / nb).glob("*"))
                      if f.is_file() and f.suffix not in (".png", ".svg")})  # the notebook holds the PNG
        seconds[f"notebook:{nb}"] = json.loads(record.read_text())["seconds"]
        spans.append((record, seconds[f"notebook:{nb}"]))
    for unit in made["trainings"]:
        bench = work / "benchmarks" / f"train-{unit['name']}.tsv"
        if bench.exists():
            seconds[f"train:{unit['name']}"] = benchmark_seconds(bench)
            spans.append((bench, seconds[f"train:{unit['name']}"]))
        for run_dir in (paths.HOME / r for r in unit["runs"]):
            files.update({f"runs/{run_dir.name}/{name}": run_dir / name
                          for name in (runs.CONFIG, runs.COMPLETE, runs.METRICS) if (run_dir / name).exists()})
            if runs.is_complete(run_dir):
                backends.add(runs.read_complete(run_dir).get("jax_backend", "unknown"))
    ends = [(f.stat().st_mtime - took, f.stat().st_mtime) for f, took in spans]
    wall = max(e for _, e in ends) - min(b for b, _ in ends) if ends else None
    finished = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(max(e for _, e in ends))) if ends else None
    files["timings.json"] = (json.dumps({"wall_s": wall, "finished": finished, "seconds": seconds}, indent=1,
                                        sort_keys=True) + "\n").encode()
    return files, {"notebooks": [job["name"] for job in made["notebooks"]], "date": finished, "wall_s": wall,
                   "runs": sum(len(u["runs"]) for u in made["trainings"]), "backends": sorted(backends)}


def _write_parts(files: Mapping[str, Path | bytes], out: Path) -> tuple[list[dict], list[dict]]:
    """Zip ``files`` into ``edition-K.zip`` parts of at most ``MAX_FILE_BYTES``, a new part when the next file's
    compressed size would not fit; the parts' and the files' manifest entries."""
    parts, entries, archive, size = [], [], None, 0
    with contextlib.ExitStack() as stack:
        for name, source in files.items():
            data = source if isinstance(source, bytes) else Path(source).read_bytes()
            cost = len(zlib.compress(data, 6)) + 2 * len(name) + 200  # its local header and central directory entry
            if cost > MAX_FILE_BYTES - 1024:
                raise EditionError(f"{name} ({source}) compresses to {cost / 2**20:.1f} MiB, more than a pack's "
                                   f"{MAX_FILE_BYTES / 2**20:.0f} MiB a file")
            if archive is None or size + cost > MAX_FILE_BYTES - 1024:
                stack.close()
                parts.append({"name": f"edition-{len(parts) + 1}.zip"})
                archive = stack.enter_context(zipfile.ZipFile(out / parts[-1]["name"], "w", zipfile.ZIP_DEFLATED,
                                                              compresslevel=6))
                size = 22
            archive.writestr(name, data)
            size += cost
            entries.append({"path": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                            "part": parts[-1]["name"]})
    for part in parts:
        part.update(bytes=(out / part["name"]).stat().st_size, sha256=file_sha256(out / part["name"]))
    return parts, entries


def pack(out: Path, *, preset: str = PRESET, device: str | None = None, commit: str | None = None) -> dict:
    """Pack the preset's workflow of this ``DIFFEQFORMER_HOME`` into ``out`` (emptied first; a folder that holds
    anything but a pack is refused). ``device`` defaults to JAX's, ``commit`` to ``DIFFEQFORMER_COMMIT``, else git's.
    Returns the manifest."""
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
    if not device:
        import jax

        n = len(jax.devices())
        device = f"{jax.devices()[0].device_kind} ({jax.default_backend()}, {n} device{'' if n == 1 else 's'})"
    named = commit or os.environ.get("DIFFEQFORMER_COMMIT")
    status = None if named else _git("status", "--porcelain", "--", *CODE)
    manifest = {"edition": 1, "preset": preset, "device": device, **about,
                "packed": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": named or git_commit() or "unknown",
                "uncommitted": bool(status.stdout.strip()) if status and status.returncode == 0 else None,
                "parts": parts, "files": entries, "code": code_hashes()}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    for f in sorted(out.iterdir()):
        if f.stat().st_size > MAX_FILE_BYTES:
            raise EditionError(f"{f} has {f.stat().st_size / 2**20:.1f} MiB, more than "
                               f"{MAX_FILE_BYTES / 2**20:.0f} MiB")
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
        size, digest = path.stat().st_size, file_sha256(path)
        if size != part["bytes"] or digest != part["sha256"]:
            raise EditionError(f"part {path} is corrupt: {size} bytes and SHA-256 {digest[:12]}..., the manifest's "
                               f"{part['bytes']} bytes and {part['sha256'][:12]}... (truncated or changed on the way)")
    names = {Path(f["path"]).stem for f in manifest["files"] if f["path"].startswith("notebooks/")}
    missing = [nb for nb in toc_notebooks() if nb not in names]
    if missing:
        raise EditionError(f"{folder} lacks the executed notebook(s) {', '.join(missing)} of _toc.yml")


def unpack(manifest: Mapping[str, Any], folder: Path, dest: Path) -> None:
    """Extract every file of the manifest into ``dest``, each checked against its SHA-256; a file outside the
    manifest, missing, or with an unsafe path is refused."""
    listed = {f["path"]: f for f in manifest["files"]}
    seen = set()
    for part in manifest["parts"]:
        try:
            with zipfile.ZipFile(folder / part["name"]) as archive:
                for info in archive.infolist():
                    name = Path(info.filename)
                    if info.filename not in listed or not name.parts or name.is_absolute() or ".." in name.parts:
                        raise EditionError(f"part {part['name']} holds {info.filename!r}, which its manifest does "
                                           "not list")
                    data = archive.read(info)
                    if hashlib.sha256(data).hexdigest() != listed[info.filename]["sha256"]:
                        raise EditionError(f"{info.filename} in part {part['name']} does not match its SHA-256")
                    (dest / name).parent.mkdir(parents=True, exist_ok=True)
                    (dest / name).write_bytes(data)
                    seen.add(info.filename)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as error:
            raise EditionError(f"part {part['name']} cannot be read ({type(error).__name__}: {error})") from None
    if missing := sorted(set(listed) - seen):
        raise EditionError(f"{len(missing)} file(s) of the manifest are in no part: {', '.join(missing[:3])}")


def _read_pack(source: Path, scratch: Path) -> tuple[Path, dict]:
    """The folder of the pack at ``source`` (its folder, a file in it, or an archive of it, unpacked in ``scratch``)
    and its manifest."""
    if not source.exists():
        raise EditionError(f"{source} does not exist")
    if source.is_dir() or source.name == MANIFEST or (source.parent / MANIFEST).exists():
        folder = source if source.is_dir() else source.parent
    else:
        try:
            shutil.unpack_archive(source, scratch)
        except (shutil.ReadError, ValueError, zipfile.BadZipFile, EOFError, OSError) as error:
            raise EditionError(f"{source} cannot be unpacked ({type(error).__name__}: {error})") from None
        if not (found := sorted(scratch.rglob(MANIFEST))):
            raise EditionError(f"{source} holds no {MANIFEST}: not a pack")
        folder = found[0].parent
    if not (folder / MANIFEST).exists():
        raise EditionError(f"{folder} has no {MANIFEST}: not a pack (python -m diffeqformer.workflow.edition pack "
                           "makes one)")
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EditionError(f"{folder / MANIFEST} is corrupt ({type(error).__name__}: {error})") from None
    if not isinstance(manifest, dict) or not {"preset", "parts", "files"} <= set(manifest):
        raise EditionError(f"{folder / MANIFEST} is corrupt: it lacks the preset, the parts or the files")
    return folder, manifest


def import_edition(source: Path, dest: Path | None = None) -> dict:
    """Check the pack at ``source`` and install it into ``dest`` (``EDITION``): unpacked into a hidden folder beside
    it, then swapped in; on any error ``dest`` stays as it was (and what a killed import left is undone first)."""
    from .jobs import swap_in

    dest = Path(dest or EDITION)
    for stale in dest.parent.glob(f".{dest.name}.import-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for old in sorted(dest.parent.glob(f".{dest.name}.old-*")):  # killed between the swap's two renames
        if dest.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(old, dest)
    with tempfile.TemporaryDirectory() as scratch:
        folder, manifest = _read_pack(Path(source), Path(scratch))
        check_manifest(manifest, folder)
        dest.parent.mkdir(parents=True, exist_ok=True)
        new = dest.with_name(f".{dest.name}.import-{os.getpid()}")
        new.mkdir()
        try:
            unpack(manifest, folder, new)
            (new / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            swap_in(new, dest)
        finally:
            shutil.rmtree(new, ignore_errors=True)
    return manifest


def load(folder: Path | None = None) -> dict | None:
    """The manifest of the committed edition in ``folder`` (``EDITION``), or None where none is committed."""
    path = Path(folder or EDITION) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else None


def staleness(manifest: Mapping[str, Any], repo: Path = paths.REPO) -> str:
    """One sentence: whether the code has changed since the edition was computed, by the manifest's SHA-256 of each
    file of ``CODE``, else by ``git diff`` from its commit."""
    commit = f"`{manifest.get('commit', 'unknown')[:12]}`"
    since, changed, why = f"since commit {commit}", None, "the edition records neither its commit nor its code"
    if manifest.get("code"):
        now, then = code_hashes(repo), manifest["code"]
        since, changed = "since this page was computed", sorted(f for f in {*now, *then} if now.get(f) != then.get(f))
    elif manifest.get("commit", "unknown") != "unknown":
        proc = _git("diff", "--name-only", manifest["commit"], "--", *CODE, repo=repo)
        if proc is None:
            why = "git is not installed"
        elif proc.returncode != 0:
            why = f"git cannot compare with that commit: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
        else:
            changed = sorted(proc.stdout.split())
    if changed is None:
        return f"Whether the code has changed since commit {commit} cannot be told here ({why})."
    if not changed:
        return f"The code (`{'`, `'.join(CODE)}`) has not changed {since}."
    shown = ", ".join(f"`{f}`" for f in changed[:4]) + (", ..." if len(changed) > 4 else "")
    return (f"**This page is older than the code**: {len(changed)} file{'' if len(changed) == 1 else 's'} of the code "
            f"changed {since} ({shown}); it shows what the code of then computed.")


def banner(manifest: Mapping[str, Any], repo: Path = paths.REPO) -> str:
    """A MyST admonition for a page's first screen: device, date, commit, preset, wall time, and ``staleness``."""
    wall = clock(manifest["wall_s"]) if manifest.get("wall_s") is not None else "not recorded"
    commit = f"`{manifest.get('commit', 'unknown')[:12]}`" + (
        " with changes not committed" if manifest.get("uncommitted") else "")
    line = staleness(manifest, repo)
    kind = "warning" if line.startswith("**This page is older") else "note"
    return "\n".join([
        "```{admonition} GPU edition: executed on a GPU, not by the build of this book", f":class: {kind}", "",
        f"Device **{manifest.get('device', 'unknown')}**, date {manifest.get('date') or 'unknown'}, commit {commit}, "
        f"preset `{manifest.get('preset')}`, workflow wall time {wall}.", "", line, "```", ""])


def render_notebook(nb: dict, manifest: Mapping[str, Any], repo: Path = paths.REPO) -> dict:
    """The executed notebook as the GPU edition shows it: the reader's view, its title marked "(GPU edition)" and
    ``banner`` below it."""
    nb = book.reader_view(nb)
    text = banner(manifest, repo)
    first = next((c for c in nb["cells"] if c["cell_type"] == "markdown"), None)
    if first is not None and "".join(first["source"]).startswith("# "):
        title, _, rest = "".join(first["source"]).partition("\n")
        first["source"] = f"{title} (GPU edition)\n\n{text}\n" + rest.lstrip("\n")
    else:
        nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": text})
    return nb


def edition_notebooks(folder: Path | None = None) -> list[str]:
    """The notebooks of the edition, in ``_toc.yml``'s order (then any other it has)."""
    from .plan import toc_notebooks

    have, order = {p.stem for p in (Path(folder or EDITION) / "notebooks").glob("*.ipynb")}, toc_notebooks()
    return [nb for nb in order if nb in have] + sorted(have - set(order))


def glued_notebooks(folder: Path | None = None) -> dict[str, dict[str, str]] | None:
    """Notebook -> the values it glued, for each notebook of the committed edition; None where none is committed."""
    folder = Path(folder or EDITION)
    if load(folder) is None:
        return None
    return {nb: book.glued(json.loads((folder / "notebooks" / f"{nb}.ipynb").read_text()))
            for nb in edition_notebooks(folder)}


def stage(src: Path, folder: Path | None = None, repo: Path = paths.REPO) -> list[str]:
    """Write the committed edition into the staged book ``src``: each notebook rendered as ``gpu/<notebook>.ipynb``,
    listed under ``TOC_PAGE`` in ``src/_toc.yml``. Returns the notebooks staged."""
    import yaml

    folder = Path(folder or EDITION)
    if (manifest := load(folder)) is None:
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
            node = list(node.values())
        for v in node if isinstance(node, list) else ():
            walk(v)

    walk(toc)
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
