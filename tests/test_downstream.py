"""F11: the held-out tasks (their rules, their provenance in the held-out split) and Levanter's lm-eval-harness run
on models whose answers are known: a model with fixed next-token probabilities, scored by hand, and tiny trained-
shape models scored on each request alone (the harness packs several requests into one sequence)."""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from haliax import Axis
from levanter.layers.attention import AttentionMask
from levanter.utils.tree_utils import inference_mode
from tokenizers import Tokenizer

from diffeqformer import paths
from diffeqformer.analysis import downstream
from diffeqformer.data import corpora
from diffeqformer.data import tasks as held_out
from diffeqformer.model.baselines import baseline_config
from helpers import tiny

SEQ = 64
BUDGET = 20  # tokens per example: several requests share a packed sequence of SEQ


def synthetic_documents(seed: int = 0, n_docs: int = 3, blocks: int = 60) -> list[tuple[str, str]]:
    """Documents of three-line blocks; every line of a block holds the block's topic word (one of 300 rare words)
    among common filler words, so that a topic word on a block's later line is a last-word target."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mir", "tan", "vel", "dor", "sun", "pe", "ri", "gal"]
    rare = sorted({"".join(rng.choice(syllables, 3)) for _ in range(400)})[:300]
    filler = ["the", "and", "of", "to", "in", "my", "is", "that", "with", "for", "not", "his", "be", "your"]
    docs = []
    for d in range(n_docs):
        lines = []
        for _ in range(blocks):
            topic = rng.choice(rare)
            for _ in range(3):
                words = list(rng.choice(filler, 5))
                words.insert(int(rng.integers(1, 5)), topic)
                lines.append(" ".join(words).capitalize() + ",")
            lines.append("")
        docs.append((f"doc{d}", "\n".join(lines)))
    return docs


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A byte-level BPE of 400 tokens trained on the synthetic documents (frequent words become single tokens)."""
    out = tmp_path_factory.mktemp("bpe")
    corpora.train_tokenizer([text for _, text in synthetic_documents(1)], out, vocab_size=400)
    return out


@pytest.fixture(scope="module")
def encode(tokenizer_dir):
    fast = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return lambda texts: [e.ids for e in fast.encode_batch(texts, add_special_tokens=False)]


@pytest.fixture(scope="module")
def task_files(tmp_path_factory, encode):
    examples, offered = held_out.build_examples(synthetic_documents(), encode, num_examples=24, num_fewshot=6,
                                                max_tokens=BUDGET, seed=0)
    return held_out.write_tasks(examples, tmp_path_factory.mktemp("tasks"), {"counts": {
        t: {"test": 24, "fewshot": 6, "candidates": offered[t]} for t in held_out.TASKS}})


def read(files: held_out.TaskFiles, task: str, split: str = "test") -> list[dict]:
    return [json.loads(line) for line in (files.directory / f"{task}.{split}.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------------------------------- the builder


def test_last_word_examples_follow_the_rules(task_files, encode):
    docs = dict(synthetic_documents())
    rows = read(task_files, held_out.LASTWORD) + read(task_files, held_out.LASTWORD, "fewshot")
    assert len(rows) == 30
    for r in rows:
        first, last = r["lines"]
        lines = docs[r["document"]].split("\n")
        word = r["target"].removeprefix(" ")
        assert r["target"] == " " + word and re.fullmatch(r"[A-Za-z]+", word)
        head = r["context"].split("\n")[-1]  # the last line up to the word
        assert lines[last].startswith(head + r["target"])
        assert r["context"] == "\n".join(lines[first:last]) + "\n" + head
        earlier = {w.lower() for w in re.findall(r"[A-Za-z]+", "\n".join(lines[first:last]))}
        assert word.lower() in earlier and word.lower() not in {w.lower() for w in re.findall(r"[A-Za-z]+", head)}
        assert len(encode([r["context"] + r["target"]])[0]) <= BUDGET


def test_next_line_examples_follow_the_rules(task_files, encode):
    docs = dict(synthetic_documents())
    rows = read(task_files, held_out.NEXTLINE)
    answers = {(r["document"], r["lines"][1]): r["choices"][r["label"]] for r in rows}
    for r in rows:
        first, last = r["lines"]
        lines = docs[r["document"]].split("\n")
        assert r["context"] == "\n".join(lines[first:last]) + "\n" and lines[first].strip()
        assert r["choices"][r["label"]] == lines[last].strip()
        assert len(r["choices"]) == held_out.NUM_CHOICES == len({c.lower() for c in r["choices"]})
        assert len(encode([r["context"] + r["choices"][r["label"]]])[0]) <= BUDGET
        own = set(lines[first:last + 1])
        for c in r["choices"]:
            assert held_out.is_next_line(c)
            if c != r["choices"][r["label"]]:
                assert c not in own
                assert abs(len(c) - len(lines[last])) <= held_out.DISTRACTOR_LENGTH * len(lines[last].strip())
    labels = [r["label"] for r in rows]
    assert len(set(labels)) > 1  # the true line is not always in the same place
    assert len(answers) == len(rows)


@pytest.mark.parametrize("task", held_out.TASKS)
def test_examples_do_not_overlap(task_files, task):
    seen: dict[str, set] = {}
    for split in held_out.SPLITS:
        for r in read(task_files, task, split):
            lines = set(range(r["lines"][0], r["lines"][1] + 1))
            assert not lines & seen.setdefault(r["document"], set()), "two examples share a line"
            seen[r["document"]] |= lines


def test_builder_is_deterministic_and_hashes_its_files(task_files, encode, tmp_path):
    examples, offered = held_out.build_examples(synthetic_documents(), encode, num_examples=24, num_fewshot=6,
                                                max_tokens=BUDGET, seed=0)
    again = held_out.write_tasks(examples, tmp_path, {"counts": {
        t: {"test": 24, "fewshot": 6, "candidates": offered[t]} for t in held_out.TASKS}})
    for name in again.hashes:
        if name.endswith(".jsonl"):  # the YAML files name their folder
            assert again.hashes[name] == task_files.hashes[name]
    assert set(again.hashes) == {f"{t}.{s}" for t in held_out.TASKS for s in ("yaml", "test.jsonl", "fewshot.jsonl")}


def test_too_small_a_split_is_refused_with_the_count_found(encode):
    with pytest.raises(ValueError, match=r"give (\d+) non-overlapping shakespeare_lastword examples .* fewer than the "
                                         r"10000 asked for"):
        held_out.build_examples(synthetic_documents(), encode, num_examples=9990, num_fewshot=10, max_tokens=BUDGET)


def test_a_last_line_longer_than_the_budget_gives_no_passage(encode):
    """A document whose last line alone exceeds a passage's budget: the lines before it that fit are none (an empty
    span, not an index past the document's end, which stopped the builder on the real corpus)."""
    doc = held_out._Document("d", "short line\n" + " ".join(["word"] * 200), encode)
    last = len(doc.lines) - 1
    assert doc.first_line(last, budget=5) == last + 1 and doc.span(last + 1, last) == ""
    assert doc.span(0, 1) == "short line\n" and doc.span(0, 2) == doc.text + "\n"
    assert held_out.lastword_candidates(doc, encode, 5, frozenset()) == []


def test_a_few_shot_prompt_fits_the_context(task_files, encode):
    budget = held_out.example_budget(SEQ, 1)
    assert budget == 30
    longest = max((r["context"] + r.get("target", "") for r in read(task_files, held_out.LASTWORD)), key=len)
    assert len(encode([longest + held_out.FEWSHOT_DELIMITER + longest])[0]) <= SEQ
    with pytest.raises(ValueError, match="5-shot prompt leaves"):
        held_out.example_budget(SEQ, 5)


def test_held_out_tasks_come_from_validation_documents(tmp_path):
    """On the real corpus: every example lies in a document of the validation split, at the lines it names."""
    archive = corpora.fetch_archive(paths.DATA_RAW)
    layout = corpora.CorpusLayout(tmp_path)
    layout.raw.mkdir(parents=True)
    shutil.copy(archive, layout.archive)
    files = held_out.build_tasks(tmp_path, num_examples=20, num_fewshot=5, max_tokens=60, vocab_size=300)
    documents = {d.name: d for d in corpora.prepare_corpus(tmp_path, vocab_size=None).documents}
    assert files.manifest["documents"].keys() == {n for n, d in documents.items() if d.split == "validation"}
    for task in held_out.TASKS:
        for split in held_out.SPLITS:
            for r in read(files, task, split):
                doc = documents[r["document"]]
                assert doc.split == "validation"
                lines = doc.text.split("\n")
                assert r["context"].startswith("\n".join(lines[r["lines"][0]:r["lines"][1]]))
    assert held_out.build_tasks(tmp_path, num_examples=20, num_fewshot=5, max_tokens=60, vocab_size=300) == files
    with pytest.raises(ValueError, match="give .* fewer than the 100010 asked for"):
        held_out.build_tasks(tmp_path, num_examples=100000, num_fewshot=10, max_tokens=30, vocab_size=300)


# --------------------------------------------------------------------------------------------------- the harness


class FixedNextToken(eqx.Module):
    """A 'model' whose next-token distribution is the same everywhere: softmax(``logits``)."""

    logits: hax.NamedArray  # [Vocab, Embed] with Embed of size 1
    Pos: Axis = eqx.field(static=True)

    @property
    def Vocab(self) -> Axis:
        return self.logits.axes[0]

    @property
    def Embed(self) -> Axis:
        return self.logits.axes[1]

    def get_lm_head(self):
        return self.logits

    def activations(self, input_ids, attn_mask=None, *, key=None, pos_ids=None):
        return hax.ones((*input_ids.axes, self.Embed), dtype=jnp.float32)


def requests(files, tokenizer_dir):
    """Every 0-shot request of the test set as (context ids, continuation ids) by task: the harness's split of
    context + continuation into the context's tokens and the rest."""
    fast = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))

    def split(context, continuation):
        whole = fast.encode(context + continuation, add_special_tokens=False).ids
        n = len(fast.encode(context, add_special_tokens=False).ids)
        return whole, n

    out = {held_out.LASTWORD: [], held_out.NEXTLINE: []}
    for r in read(files, held_out.LASTWORD):
        out[held_out.LASTWORD].append(split(r["context"], r["target"]))
    for r in read(files, held_out.NEXTLINE):
        out[held_out.NEXTLINE].append(([split(r["context"], c) for c in r["choices"]], r["choices"], r["label"]))
    return out


def expected_metrics(scores, reqs) -> dict:
    """LAMBADA's and HellaSwag's metrics from per-request (log-likelihood, greedy) scores: ``scores(ids, n)``."""
    last = [scores(ids, n) for ids, n in reqs[held_out.LASTWORD]]
    out = {("shakespeare_lastword", "acc"): np.mean([g for _, g in last]),
           ("shakespeare_lastword", "perplexity"): math.exp(-np.mean([ll for ll, _ in last]))}
    acc, acc_norm = [], []
    for choices, texts, label in reqs[held_out.NEXTLINE]:
        ll = np.array([scores(ids, n)[0] for ids, n in choices])
        acc.append(int(np.argmax(ll)) == label)
        acc_norm.append(int(np.argmax(ll / np.array([len(t) for t in texts]))) == label)
    out[("shakespeare_nextline", "acc")] = np.mean(acc)
    out[("shakespeare_nextline", "acc_norm")] = np.mean(acc_norm)
    return out


def harness_metrics(model, tokenizer_dir, files, shots=(0,)) -> dict:
    frame = downstream.evaluate(model, corpora.load_tokenizer(tokenizer_dir), held_out.TASKS, list(shots),
                                include_path=files.directory, batch_size=4)
    return {(r.task, r.metric): r.value for r in frame[frame.shots == 0].itertuples()}, frame


def assert_metrics(got: dict, want: dict):
    assert got.keys() == want.keys()
    for key, value in want.items():
        if key[1] == "perplexity":
            assert got[key] == pytest.approx(value, rel=1e-4), key
        else:
            assert got[key] == value, key


def test_harness_scores_a_fixed_distribution_as_computed_by_hand(task_files, tokenizer_dir):
    reqs = requests(task_files, tokenizer_dir)
    # the most frequent one-token target becomes the most likely token: the examples it ends are right, no others
    targets = [ids[n:] for ids, n in reqs[held_out.LASTWORD]]
    favourite = max({t[0] for t in targets if len(t) == 1}, key=lambda tok: targets.count([tok]))
    vocab = Axis("vocab", corpora.load_tokenizer(tokenizer_dir).vocab_size)
    logits = np.random.default_rng(0).normal(size=vocab.size).astype(np.float32)
    logits[favourite] = 8.0
    model = FixedNextToken(hax.named(jnp.asarray(logits)[:, None], (vocab, Axis("embed", 1))), Axis("position", SEQ))
    log_p = np.asarray(jax.nn.log_softmax(jnp.asarray(logits)), dtype=np.float64)

    def scores(ids, n):
        return float(sum(log_p[t] for t in ids[n:])), all(t == favourite for t in ids[n:])

    want = expected_metrics(scores, reqs)
    assert want[("shakespeare_lastword", "acc")] == targets.count([favourite]) / len(targets) > 0
    got, frame = harness_metrics(model, tokenizer_dir, task_files)
    assert_metrics(got, want)
    assert set(frame.n) == {24}
    assert jax.device_count() == int(os.environ.get(DEVICES, jax.device_count()))


DEVICES = "DIFFEQFORMER_TEST_DEVICES"
"""The device count a child process of ``test_several_devices_in_one_process_score_as_by_hand`` must have."""


def test_several_devices_in_one_process_score_as_by_hand():
    """F11 in a process that sees several devices (a machine with several GPUs): the hand-computed check above, in a
    child process of 4 CPU devices. Levanter's harness broadcast its batches over every device of the process and
    failed there ("Expected shard shape (4,) doesn't match the single device array shape (1,)")."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
    test = f"{__file__}::test_harness_scores_a_fixed_distribution_as_computed_by_hand"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", test],
                         env={**os.environ, "XLA_FLAGS": flags, DEVICES: "4"}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout[-4000:]


@pytest.mark.parametrize("kind", ["diffeqformer", "gpt2"])
def test_packed_requests_are_scored_as_if_alone(task_files, tokenizer_dir, kind, getkey):
    """Several requests share each packed sequence; a model with learned positions scores each as if alone."""
    vocab = Axis("vocab", corpora.load_tokenizer(tokenizer_dir).vocab_size)
    config = tiny(max_seq_len=SEQ, variant="gpt")
    if kind == "gpt2":
        config = baseline_config(config, "gpt2")
    model = config.build(vocab, key=getkey())
    assert model.embeddings.position_embeddings is not None

    model = inference_mode(model, True)

    @jax.jit
    def log_probs(ids):  # the model on one request alone, positions 0, 1, ..., SEQ - 1
        x = model.activations(hax.named(ids, "position"), AttentionMask.causal())
        return jax.nn.log_softmax(hax.dot(x, model.get_lm_head(), axis=model.Embed).array, axis=-1)

    def scores(ids, n):
        # padded to SEQ after its end (one compiled program for every request): under the causal mask the padding
        # changes nothing before it
        padded = jnp.zeros(SEQ, dtype=jnp.int32).at[: len(ids)].set(jnp.asarray(ids, dtype=jnp.int32))
        lp = np.asarray(log_probs(padded), dtype=np.float64)[: len(ids)]
        rows = range(n - 1, len(ids) - 1)
        return float(sum(lp[i, ids[i + 1]] for i in rows)), all(int(np.argmax(lp[i])) == ids[i + 1] for i in rows)

    want = expected_metrics(scores, requests(task_files, tokenizer_dir))
    got, _ = harness_metrics(model, tokenizer_dir, task_files)
    assert_metrics(got, want)


def test_segment_positions_restart_at_each_request():
    Pos, Batch = Axis("position", 6), Axis("batch", 2)
    ids = hax.named(jnp.array([[3, 3, 3, 4, 4, -1], [0, 0, 0, 0, 0, 0]], dtype=jnp.int32), (Batch, Pos))
    assert downstream.positions_in_segments(ids, Pos).array.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


# ------------------------------------------------------------------------------------------------------ bad input


def test_an_unknown_task_lists_the_available_ones():
    with pytest.raises(ValueError, match="unknown task 'lambada'; the held-out tasks are shakespeare_lastword, "
                                         "shakespeare_nextline .* the paper's are arc_easy"):
        downstream.check_tasks(["shakespeare_lastword", "lambada"])


def test_paper_tasks_offline_stop_at_once_naming_them(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="the tasks arc_easy, arc_challenge, hellaswag, lambada_openai, .* need "
                                           "the Hugging Face hub"):
        downstream.tasks_for(paper_tasks=True)
    assert downstream.tasks_for(paper_tasks=False) == list(held_out.TASKS)


def test_a_missing_or_unfinished_run_is_named(tmp_path, task_files):
    unfinished = tmp_path / "runs" / "cpu-gpt2-seed1"
    unfinished.mkdir(parents=True)
    for runs, message in (({"gpt": [str(tmp_path / "nowhere")]}, r"runs\['gpt'\]\[0\] = .*nowhere.*no such directory"),
                          ({"gpt": [str(unfinished)]}, r"runs\['gpt'\]\[0\] = .*cpu-gpt2-seed1 has no complete.json")):
        with pytest.raises(FileNotFoundError, match=message):
            downstream.evaluate_runs(runs, held_out.TASKS, [0], task_files=task_files, cache_dir=None)


def test_shots_are_checked_against_the_context():
    assert downstream.check_shots([0, 1], SEQ) == [0, 1]
    for bad in ([0, 0], [-1], [], [1.5]):
        with pytest.raises(ValueError, match="shots must be"):
            downstream.check_shots(bad, SEQ)
    with pytest.raises(ValueError, match="5-shot prompt leaves"):
        downstream.check_shots([0, 5], SEQ)
