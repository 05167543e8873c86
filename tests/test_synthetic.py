"""The synthetic language: its ground truth is right, its tokenizer is Levanter's."""

import random

from diffeqformer.data.synthetic import FEMALE, MALE, VOCABULARY, document, encode, prepare, prompts


def test_ground_truth_of_prompts():
    items = prompts(200, seed=1)
    assert {p.task for p in items} == {"agreement", "induction"}
    for p in items:
        truth = p.words[p.true_position]
        if p.task == "agreement":
            assert p.words[-1] == "with"
            assert (truth in MALE and p.answer == "his") or (truth in FEMALE and p.answer == "her")
            # the distractor in the sentence before has the other gender
            distractor = p.words[p.true_position - 5]
            assert (distractor in MALE) != (truth in MALE)
        else:
            assert truth == p.answer  # first occurrence of the word to copy
            bar = len(p.words) - 1 - p.words[::-1].index("|")
            assert p.true_position < bar


def test_documents_are_deterministic_and_in_vocabulary():
    a, b = document(random.Random(3)), document(random.Random(3))
    assert a == b
    assert set(a.split()) <= set(VOCABULARY)


def test_tokenizer_matches_encode(tmp_path):
    from diffeqformer.data.corpora import load_tokenizer

    config = prepare(tmp_path, train_documents=5, validation_documents=2)
    tok = load_tokenizer(config.tokenizer)
    p = prompts(1, seed=2)[0]
    ids = tok.encode(" ".join(p.words), add_special_tokens=True)
    assert list(encode(p)[1:]) == [i for i in ids if i != tok.bos_token_id][: len(p.words)]
    assert len(tok) == len(VOCABULARY)
