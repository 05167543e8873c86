"""Downstream tasks built from the corpus's held-out documents, as lm-evaluation-harness task files (F11).

The paper evaluates on public benchmarks that live on the Hugging Face hub. Two of them can be rebuilt from any
held-out text, offline, and this module builds them from the Shakespeare corpus's validation documents (never from
its training documents: ``corpora.assign_splits`` splits by document):

* ``shakespeare_lastword``, in the manner of LAMBADA (Paperno et al. 2016): predict a passage's last word, chosen
  so that the passage's *broader context* holds it. The passage is cut after a word that occurs in an earlier line
  of the passage and not in its own line before it, has at least ``MIN_WORD_LETTERS`` letters and is none of the ``COMMON_WORDS`` most
  frequent words of the held-out text (a function word is guessed from anything). Scored as LAMBADA is: accuracy
  (the word's tokens are all the model's greedy predictions) and the perplexity of the target word.
* ``shakespeare_nextline``, in the manner of HellaSwag (Zellers et al. 2019): the line that follows a passage against
  ``NUM_CHOICES - 1`` distractors, lines that follow other held-out passages, of similar length (within
  ``DISTRACTOR_LENGTH`` of the true line's characters). Scored by log-likelihood normalised by the choice's length
  (``acc_norm``: the log-likelihood per byte, as the harness normalises HellaSwag), and by the plain log-likelihood.

A passage is a run of lines of one document, from a line that is not blank, as many as fit in ``max_tokens`` tokens of the evaluated models'
tokenizer with its answer; the examples of a task do not overlap. Candidates are shuffled with ``seed`` and taken
in that order: the first ``num_examples`` are the test examples, the next ``num_fewshot`` the pool the harness draws
few-shot examples from (the same held-out documents, other passages). A k-shot prompt is k examples and the query
joined by a blank line, so ``max_tokens`` = ``example_budget(max_seq_len, k)`` keeps it within the model's context.

Layout below the corpus cache (``CorpusLayout.cache``)::

    tasks/<key>/<task>.yaml                 the task definition lm-eval reads (``--include_path tasks/<key>``)
    tasks/<key>/<task>.{test,fewshot}.jsonl  its examples, one JSON object per line
    tasks/<key>/manifest.json               build parameters, held-out documents, counts, every file's SHA-256

``<key>`` is a hash of the build parameters, the held-out texts and the tokenizer, so a directory that exists holds
the tasks asked for. Command line: ``python -m diffeqformer.data tasks --examples 200 --max-tokens 31``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from tokenizers import Tokenizer

from .. import paths
from ..numerics import check_positive_int, digest, write_atomically
from . import corpora

LASTWORD, NEXTLINE = "shakespeare_lastword", "shakespeare_nextline"
TASKS = (LASTWORD, NEXTLINE)
"""The held-out tasks, by their lm-evaluation-harness names."""
SPLITS = ("test", "fewshot")
"""The examples evaluated, and the pool the harness draws few-shot examples from."""
FEWSHOT_DELIMITER = "\n\n"
"""Between the examples of a few-shot prompt (the harness's default)."""

MIN_WORD_LETTERS = 3
COMMON_WORDS = 100
"""The held-out text's most frequent words, which are never a last-word target."""
MIN_CONTEXT_TOKENS = 8
"""A passage has at least this many tokens before its answer."""
NUM_CHOICES = 4
"""Choices per next-line example: the true line and three distractors, as in HellaSwag."""
MIN_LINE_WORDS = 4
"""A next line (true or distractor) has at least this many words."""
DISTRACTOR_LENGTH = 0.3
"""A distractor's length in characters is within this fraction of the true line's."""

# Bump when a rule above or below changes what is built, so that cached task files are rebuilt.
_RULES_VERSION = 1

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")
# What is not a line of speech: a speaker's name ("CHARLES."), a stage direction ("[Exit DENNIS.]"), a heading.
_NOT_SPEECH = re.compile(r"^\s*(\[.*|[A-Z0-9 ,.'&-]+\.?\s*)$")


@dataclass(frozen=True)
class Example:
    """One example of a task: ``context`` is followed by ``answer`` (the last word with its leading space, or the
    true next line); ``choices`` and ``label`` for a multiple-choice example."""

    document: str
    first_line: int
    last_line: int
    """The lines of the document the passage spans (its answer's line included)."""
    context: str
    answer: str
    choices: tuple[str, ...] = ()
    label: int = -1

    def record(self) -> dict:
        """The example as a line of the task's JSONL file."""
        out = {"document": self.document, "lines": [self.first_line, self.last_line], "context": self.context}
        if self.choices:
            return {**out, "choices": list(self.choices), "label": self.label}
        return {**out, "target": self.answer}


@dataclass(frozen=True)
class TaskFiles:
    """What ``build_tasks`` wrote: the folder to hand lm-eval (``include_path``) and its manifest."""

    directory: Path
    manifest: dict

    @property
    def hashes(self) -> dict[str, str]:
        """SHA-256 of every task file (definitions and examples) by file name: what a figure's provenance records."""
        return dict(self.manifest["files"])

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        """Examples per task and split (``test``, ``fewshot``), and the candidates the held-out text offered."""
        return {t: dict(c) for t, c in self.manifest["counts"].items()}

    def yaml(self, task: str) -> Path:
        """The task's definition file."""
        _check_task(task)
        return self.directory / f"{task}.yaml"


def example_budget(max_seq_len: int, shots: int) -> int:
    """Tokens one example may have so that a ``shots``-shot prompt (``shots`` examples and the query, a blank line
    between them, about one token each, plus one token of slack for merges at the joins) fits in ``max_seq_len``."""
    check_positive_int(max_seq_len, "max_seq_len")
    if not isinstance(shots, int) or shots < 0:
        raise ValueError(f"shots must be a non-negative integer, got {shots!r}")
    budget = (max_seq_len - 2 * shots - 1) // (shots + 1)
    if budget < MIN_CONTEXT_TOKENS + 2:
        raise ValueError(f"a {shots}-shot prompt leaves {budget} tokens per example in {max_seq_len}: too few for a "
                         f"passage of {MIN_CONTEXT_TOKENS} tokens and its answer")
    return budget


# ---------------------------------------------------------------------------------------------------- building


class _Document:
    """A document's lines with their offsets and token counts."""

    def __init__(self, name: str, text: str, encode: Callable[[list[str]], list[list[int]]]):
        self.name, self.text = name, text
        self.lines = text.split("\n")
        self.starts = np.cumsum([0] + [len(line) + 1 for line in self.lines[:-1]])
        # tokens of each line with its newline: their sum estimates a passage's length, which is then counted exactly
        self.tokens = np.array([len(ids) for ids in encode([line + "\n" for line in self.lines])])

    def span(self, first: int, end: int) -> str:
        """The text of lines ``first`` .. ``end - 1`` with the newline after each; empty where ``first >= end`` (a
        document's last line longer than a passage's budget asks for the lines after it)."""
        if first >= end:
            return ""
        return self.text[self.starts[first]:self.starts[end]] if end < len(self.lines) else self.text[
            self.starts[first]:] + "\n"

    def first_line(self, last: int, budget: int) -> int:
        """The earliest line from which lines ``first`` .. ``last`` hold at most ``budget`` tokens (estimated)."""
        total, first = 0, last + 1
        while first > 0 and total + self.tokens[first - 1] <= budget:
            first -= 1
            total += self.tokens[first]
        return first


def _fit(encode, doc: _Document, first: int, last: int, context_of: Callable[[int], str], answer: str, budget: int):
    """The passage from the earliest first line at or after ``first`` (a line that is not blank) whose context and
    answer hold at most ``budget`` tokens, counted exactly, and at least ``MIN_CONTEXT_TOKENS`` before the answer, as
    (first line, context); None if there is none."""
    while first < last:
        if doc.lines[first].strip():
            context = context_of(first)
            context_tokens, total = (len(ids) for ids in encode([context, context + answer]))
            if total <= budget:
                return (first, context) if context_tokens >= MIN_CONTEXT_TOKENS else None
        first += 1
    return None


def common_words(texts: Sequence[str], n: int = COMMON_WORDS) -> frozenset[str]:
    """The ``n`` most frequent words (lowercase) of ``texts``, ties broken alphabetically."""
    counts = Counter(w.lower() for text in texts for w in _WORD.findall(text))
    return frozenset(w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n])


def lastword_candidates(doc: _Document, encode, budget: int, common: frozenset[str]) -> list[Example]:
    """Every passage of ``doc`` that ends in a word its earlier lines hold and its own line does not before it (see
    the module docstring), as long as ``budget`` allows: the passage is cut after the word."""
    out = []
    for last, line in enumerate(doc.lines):
        for match in _WORD.finditer(line):
            word, at = match.group(), match.start()
            if (at == 0 or line[at - 1] != " " or "'" in word or len(word) < MIN_WORD_LETTERS
                    or word.lower() in common):
                continue
            head = line[:at - 1]  # the line before the target word and its space
            if word.lower() in {w.lower() for w in _WORD.findall(head)}:
                continue
            earliest = doc.first_line(last, budget)  # a passage that fits starts here or later
            if word.lower() not in {w.lower() for w in _WORD.findall(doc.span(earliest, last))}:
                continue
            found = _fit(encode, doc, earliest, last,
                         lambda first: doc.span(first, last) + head, " " + word, budget)
            if found is None:
                continue
            first, context = found
            if word.lower() in {w.lower() for w in _WORD.findall(doc.span(first, last))}:
                out.append(Example(doc.name, first, last, context, " " + word))
    return out


def is_next_line(line: str) -> bool:
    """Whether a line can be a next-line answer or distractor: speech of ``MIN_LINE_WORDS`` words or more, not a
    speaker's name, a stage direction or a heading."""
    return len(_WORD.findall(line)) >= MIN_LINE_WORDS and not _NOT_SPEECH.match(line)


def nextline_candidates(doc: _Document, encode, budget: int) -> list[Example]:
    """Every passage of ``doc`` followed by a line that ``is_next_line``, as long as ``budget`` allows, with a line
    of speech in it (not only a speaker's name); choices are added later, from other passages."""
    out = []
    for last, line in enumerate(doc.lines):
        if last == 0 or not is_next_line(line):
            continue
        answer = line.strip()
        found = _fit(encode, doc, doc.first_line(last, budget), last, lambda first: doc.span(first, last), answer,
                     budget)
        if found is not None and any(is_next_line(line) for line in doc.lines[found[0]:last]):
            out.append(Example(doc.name, found[0], last, found[1], answer))
    return out


def select(candidates: Sequence[Example], n: int, rng: np.random.Generator) -> list[Example]:
    """Up to ``n`` candidates in a random order (``rng``), skipping any that shares a line with one taken."""
    taken: list[Example] = []
    used: dict[str, set[int]] = {}
    for i in rng.permutation(len(candidates)):
        c = candidates[i]
        lines = set(range(c.first_line, c.last_line + 1))
        if lines & used.setdefault(c.document, set()):
            continue
        used[c.document] |= lines
        taken.append(c)
        if len(taken) == n:
            break
    return taken


def add_choices(example: Example, pool: Sequence[Example], rng: np.random.Generator) -> Example:
    """``example`` with ``NUM_CHOICES - 1`` distractors: next lines of other passages of ``pool`` (not of its own
    lines, no two alike, none like the answer), of a length within ``DISTRACTOR_LENGTH`` of the answer's."""
    length = len(example.answer)
    seen = {example.answer.lower()}
    distractors = []
    for i in rng.permutation(len(pool)):
        other = pool[i]
        line = other.answer
        if (other.document == example.document and example.first_line <= other.last_line <= example.last_line
                or line.lower() in seen or abs(len(line) - length) > DISTRACTOR_LENGTH * length):
            continue
        seen.add(line.lower())
        distractors.append(line)
        if len(distractors) == NUM_CHOICES - 1:
            break
    if len(distractors) < NUM_CHOICES - 1:
        raise ValueError(f"only {len(distractors)} distractors of the answer's length for {example.answer!r}")
    label = int(rng.integers(NUM_CHOICES))
    choices = distractors[:label] + [example.answer] + distractors[label:]
    return Example(example.document, example.first_line, example.last_line, example.context, example.answer,
                   tuple(choices), label)


def build_examples(documents: Sequence[tuple[str, str]], encode: Callable[[list[str]], list[list[int]]], *,
                   num_examples: int, num_fewshot: int, max_tokens: int,
                   seed: int = 0) -> tuple[dict[str, dict[str, list[Example]]], dict[str, int]]:
    """The examples of every task, by task and split, from ``documents`` (name, text) measured with ``encode`` (a
    batch of texts -> their token ids), and the number of candidates each task found.

    Raises ``ValueError`` when the documents give fewer than ``num_examples + num_fewshot`` non-overlapping
    examples of a task, saying how many they gave."""
    check_positive_int(num_examples, "num_examples")
    if not isinstance(num_fewshot, int) or num_fewshot < 0:
        raise ValueError(f"num_fewshot must be a non-negative integer, got {num_fewshot!r}")
    check_positive_int(max_tokens, "max_tokens")
    docs = [_Document(name, text, encode) for name, text in documents]
    common = common_words([d.text for d in docs])
    found = {LASTWORD: [c for d in docs for c in lastword_candidates(d, encode, max_tokens, common)],
             NEXTLINE: [c for d in docs for c in nextline_candidates(d, encode, max_tokens)]}
    need = num_examples + num_fewshot
    out, offered = {}, {}
    for i, task in enumerate(TASKS):
        rng = np.random.default_rng([seed, i])
        taken = select(found[task], need, rng)
        offered[task] = len(found[task])
        if len(taken) < need:
            raise ValueError(
                f"the held-out documents ({', '.join(d.name for d in docs)}) give {len(taken)} non-overlapping "
                f"{task} examples of at most {max_tokens} tokens ({len(found[task])} candidates), fewer than the "
                f"{need} asked for ({num_examples} test + {num_fewshot} few-shot): ask for fewer examples, or "
                f"allow longer ones")
        if task == NEXTLINE:
            taken = [add_choices(e, found[task], rng) for e in taken]
        split = {"test": taken[:num_examples], "fewshot": taken[num_examples:]}
        out[task] = {s: sorted(split[s], key=lambda e: (e.document, e.first_line)) for s in SPLITS}
    return out, offered


def task_definition(task: str, data_files: dict[str, str]) -> dict:
    """The lm-evaluation-harness task config (its YAML) of ``task``, reading its examples from ``data_files``."""
    _check_task(task)
    # fields by name, not as Jinja templates ("{{context}}"), which lm-eval compiles again for every example
    common = {"task": task, "dataset_path": "json", "dataset_kwargs": {"data_files": data_files},
              "test_split": "test", "fewshot_split": "fewshot", "doc_to_text": "context",
              "target_delimiter": "", "fewshot_delimiter": FEWSHOT_DELIMITER, "metadata": {"version": _RULES_VERSION}}
    if task == LASTWORD:  # as lm-eval's lambada_openai
        return {**common, "output_type": "loglikelihood", "doc_to_target": "target", "metric_list": [
            {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    return {**common, "output_type": "multiple_choice", "doc_to_target": "label", "doc_to_choice": "choices",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},  # as hellaswag
                            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}]}


def write_tasks(examples: dict[str, dict[str, list[Example]]], directory: Path, manifest: dict) -> TaskFiles:
    """Write every task's YAML and JSONL files and the manifest (``manifest`` plus the files' SHA-256) into
    ``directory`` (atomically: the manifest last)."""
    directory = Path(directory)

    def write(manifest_path: Path):
        files = {}
        for task, splits in examples.items():
            data_files = {}
            for split, items in splits.items():
                name = f"{task}.{split}.jsonl"
                (manifest_path.parent / name).write_text("".join(json.dumps(e.record()) + "\n" for e in items))
                data_files[split] = str(directory / name)
            name = f"{task}.yaml"
            (manifest_path.parent / name).write_text(yaml.safe_dump(task_definition(task, data_files), sort_keys=False))
        for f in sorted(manifest_path.parent.iterdir()):
            if f != manifest_path:
                files[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
        manifest_path.write_text(json.dumps({**manifest, "files": files}, indent=1) + "\n")

    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(directory / "manifest.json", write)
    return TaskFiles(directory, json.loads((directory / "manifest.json").read_text()))


def build_tasks(root: Path = paths.DATA, *, num_examples: int, max_tokens: int, num_fewshot: int = 50,
                seed: int = 0, domain: str = "all", tokenizer: str | Path | None = None,
                vocab_size: int = corpora.DEFAULT_VOCAB_SIZE) -> TaskFiles:
    """The task files of ``TASKS`` built from the validation documents of the Shakespeare corpus below ``root``
    (prepared first if needed), with ``num_examples`` test and ``num_fewshot`` few-shot examples per task of at most
    ``max_tokens`` tokens of ``tokenizer`` (a directory or hub name; default: the corpus's BPE of ``vocab_size``).

    Built once: the folder is named by a hash of everything above (``manifest.json`` lists it) and re-used."""
    info = corpora.prepare_corpus(root, vocab_size=vocab_size if tokenizer is None else None)
    documents = [(d.name, d.text) for d in info.select(domain, "validation")]
    tokenizer = info.tokenizer_dir if tokenizer is None else tokenizer
    tokenizer_file = Path(tokenizer) / "tokenizer.json"
    key = {
        "rules_version": _RULES_VERSION, "num_examples": num_examples, "num_fewshot": num_fewshot,
        "max_tokens": max_tokens, "seed": seed, "domain": domain,
        "documents": {name: hashlib.sha256(text.encode()).hexdigest() for name, text in documents},
        "tokenizer": (hashlib.sha256(tokenizer_file.read_bytes()).hexdigest() if tokenizer_file.exists()
                      else str(tokenizer)),
    }
    directory = info.layout.cache / "tasks" / digest(key)
    if (directory / "manifest.json").exists():
        return TaskFiles(directory, json.loads((directory / "manifest.json").read_text()))
    if tokenizer_file.exists():  # the Rust tokenizer: faster on short texts than Levanter's wrapper (measurements page)
        fast = Tokenizer.from_file(str(tokenizer_file))

        def encode(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in fast.encode_batch(texts, add_special_tokens=False)]
    else:
        encode = corpora.load_tokenizer(tokenizer).encode_batch

    examples, offered = build_examples(documents, encode, num_examples=num_examples, num_fewshot=num_fewshot,
                                       max_tokens=max_tokens, seed=seed)
    counts = {t: {**{s: len(examples[t][s]) for s in SPLITS}, "candidates": offered[t]} for t in TASKS}
    manifest = {**key, "tokenizer_path": paths.home_relative(tokenizer) if tokenizer_file.exists() else str(tokenizer),
                "counts": counts,
                "rules": {"min_word_letters": MIN_WORD_LETTERS, "common_words": COMMON_WORDS,
                          "min_context_tokens": MIN_CONTEXT_TOKENS, "num_choices": NUM_CHOICES,
                          "min_line_words": MIN_LINE_WORDS, "distractor_length": DISTRACTOR_LENGTH}}
    return write_tasks(examples, directory, manifest)


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown held-out task {task!r}; the held-out tasks are {', '.join(TASKS)}")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m diffeqformer.data tasks``: build the task files and print where they are, with their counts."""
    parser = argparse.ArgumentParser(prog="python -m diffeqformer.data tasks",
                                     description="Build F11's tasks from the corpus's held-out documents.")
    parser.add_argument("--examples", type=int, default=200, help="test examples per task")
    parser.add_argument("--fewshot", type=int, default=50, help="few-shot examples per task (drawn apart)")
    parser.add_argument("--max-tokens", type=int, default=example_budget(64, 1),
                        help="tokens of one example, context and answer (default: a 1-shot prompt in 64 tokens)")
    parser.add_argument("--seed", type=int, default=0, help="the order in which candidates are taken")
    parser.add_argument("--domain", choices=corpora.DOMAINS, default="all")
    parser.add_argument("--vocab-size", type=int, default=corpora.DEFAULT_VOCAB_SIZE, help="the corpus's BPE")
    parser.add_argument("--root", type=Path, default=paths.DATA, help="data root (raw/ and cache/ go below it)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        files = build_tasks(args.root, num_examples=args.examples, num_fewshot=args.fewshot,
                            max_tokens=args.max_tokens, seed=args.seed, domain=args.domain,
                            vocab_size=args.vocab_size)
    except ValueError as error:
        parser.exit(2, f"error: {error}\n")
    print(f"tasks in {files.directory} ({time.perf_counter() - start:.1f} s)")
    for task, count in files.counts.items():
        print(f"{task}: {count['test']} test, {count['fewshot']} few-shot examples (of {count['candidates']} "
              f"candidates)")
    for name, sha in files.hashes.items():
        print(f"{sha}  {name}")
