"""NER data (readers, IOB1 -> IOB2, sub-token alignment, few-shot) and span F1, on hand examples."""
import random
from pathlib import Path

import pytest
from seqeval.metrics.sequence_labeling import get_entities
from seqeval.scheme import IOB2
from seqeval.metrics import f1_score

from jaxdepth.analysis.entity_f1 import f1
from jaxdepth.data.finetune.ner_sentences import (LABELS, Sentence, encode_tags, few_shot_sample,
                                                  iob1_to_iob2, read_conll2003, read_wikiann)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "ner"
IGNORE_LABEL = -100  # label of non-first sub-tokens: left out of the loss and the metric


def entity_types(sentences) -> list[str]:
    """Sorted entity types (the C classes of few-shot sampling) seen in the data."""
    return sorted({tag[2:] for s in sentences for tag in s.tags if tag != "O"})


def label_set(sentences) -> tuple[str, ...]:
    """O, then B-X, I-X for every entity type X in sorted order (I-X even if unseen)."""
    return ("O",) + tuple(f"{p}-{t}" for t in entity_types(sentences) for p in "BI")


def align_first_subtoken(word_pieces_per_word, labels,
                         ignore: int = IGNORE_LABEL) -> tuple[list[int], list[int]]:
    """Flatten per-word piece ids; the first piece of a word carries its label, the rest ``ignore``.

    A word with no pieces would lose its label (and its gold entity) silently, so it is an error.
    """
    if len(word_pieces_per_word) != len(labels):
        raise ValueError(f"{len(word_pieces_per_word)} words but {len(labels)} labels")
    pieces: list[int] = []
    piece_labels: list[int] = []
    for i, (word, label) in enumerate(zip(word_pieces_per_word, labels)):
        if len(word) == 0:
            raise ValueError(f"word {i} has no sub-tokens, so its label would be lost")
        pieces.extend(word)
        piece_labels.append(label)
        piece_labels.extend([ignore] * (len(word) - 1))
    return pieces, piece_labels


# --- IOB1 -> IOB2 ---------------------------------------------------------------------------

@pytest.mark.parametrize("iob1,iob2", [
    (["I-ORG", "O", "I-MISC", "O"], ["B-ORG", "O", "B-MISC", "O"]),
    (["I-PER", "I-PER", "O"], ["B-PER", "I-PER", "O"]),
    # Adjacent same-type entities: IOB1 marks the second with B-, which stays B-.
    (["I-LOC", "B-LOC", "B-LOC", "I-LOC"], ["B-LOC", "B-LOC", "B-LOC", "I-LOC"]),
    # A change of type without O in between opens a new entity.
    (["I-ORG", "I-LOC", "I-LOC"], ["B-ORG", "B-LOC", "I-LOC"]),
    (["O", "O"], ["O", "O"]),
])
def test_iob1_to_iob2(iob1, iob2):
    assert iob1_to_iob2(iob1) == iob2


def test_iob1_to_iob2_rejects_bad_tags():
    with pytest.raises(ValueError, match="'X-PER'"):
        iob1_to_iob2(["O", "X-PER"])


# --- span F1 ---------------------------------------------------------------------------------

def _random_iob1(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(["O", "O", "I-PER", "I-LOC", "B-LOC", "I-ORG", "B-PER"]) for _ in range(n)]


def test_iob1_converted_to_iob2_keeps_the_spans_seqeval_reads():
    """Our IOB1 -> IOB2 conversion (CoNLL-2003) gives well-formed IOB2 with the entities that
    seqeval's default (conlleval) decoding finds in the IOB1 input, and its strict IOB2 mode
    scores the converted tags as the default mode does."""
    rng = random.Random(0)
    seqs = [_random_iob1(rng, rng.randint(1, 12)) for _ in range(300)]
    for iob1 in seqs:
        iob2 = iob1_to_iob2(iob1)
        assert get_entities(iob2) == get_entities(iob1), (iob1, iob2)
        assert not any(t.startswith("I-") and (i == 0 or iob2[i - 1][2:] != t[2:])
                       for i, t in enumerate(iob2)), iob2  # every entity opens with B-
    gold = [iob1_to_iob2(s) for s in seqs]
    pred = [iob1_to_iob2(_random_iob1(rng, len(s))) for s in seqs]
    want = f1_score(gold, pred, mode="strict", scheme=IOB2)
    assert f1(gold, pred)["f1"] == pytest.approx(want, rel=1e-12) and 0 < want < 1


def test_f1_half_right():
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    pred = [["B-PER", "I-PER", "O", "O"]]
    # 2 gold, 1 predicted, 1 correct.
    assert f1(gold, pred) == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3)}
    # 2 gold, 2 predicted, 1 correct -> P = R = F1 = 0.5 (the second has the wrong end).
    pred = [["B-PER", "I-PER", "O", "O"], ["O", "B-ORG", "O"]]
    gold = [["B-PER", "I-PER", "O", "O"], ["O", "B-ORG", "I-ORG"]]
    assert f1(gold, pred) == {"precision": 0.5, "recall": 0.5, "f1": 0.5}


def test_f1_type_mismatch_and_i_after_o():
    # Right boundaries, wrong type: no credit.
    assert f1([["B-PER", "I-PER"]], [["B-ORG", "I-ORG"]])["f1"] == 0.0
    # Predicted "O I-LOC I-LOC" is the span LOC[1, 3), which matches gold "O B-LOC I-LOC".
    assert f1([["O", "B-LOC", "I-LOC"]], [["O", "I-LOC", "I-LOC"]])["f1"] == 1.0
    # Spans are matched within their sentence only (micro over sentences, not a flat stream):
    # gold PER[0,1) in sentence 0, predicted PER[0,1) in sentence 1 -> nothing correct.
    out = f1([["B-PER"], ["O"]], [["O"], ["B-PER"]])
    assert out == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_f1_errors():
    with pytest.raises(ValueError, match="2 gold sequences but 1"):
        f1([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="sequence 0"):
        f1([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="predicted sequence 0, tag 1: invalid tag 'PER'"):
        f1([["O", "B-PER"]], [["O", "PER"]])


# --- sub-tokens ------------------------------------------------------------------------------

def test_align_first_subtoken():
    # "Sioux" -> [11], "Falls" -> [12, 13, 14], "!" -> [15, 16]
    pieces, labels = align_first_subtoken([[11], [12, 13, 14], [15, 16]], [3, 4, 0])
    assert pieces == [11, 12, 13, 14, 15, 16]
    assert labels == [3, 4, -100, -100, 0, -100]
    _, labels = align_first_subtoken([[1, 2]], [5], ignore=-1)
    assert labels == [5, -1]
    with pytest.raises(ValueError, match="2 words but 1 labels"):
        align_first_subtoken([[1], [2]], [0])
    with pytest.raises(ValueError, match="word 1 has no sub-tokens"):
        align_first_subtoken([[1], []], [0, 0])


# --- few-shot --------------------------------------------------------------------------------

def test_few_shot_sample():
    pool = [Sentence((f"w{i}",), ("O",)) for i in range(100)]
    a = few_shot_sample(pool, n_per_class=5, n_classes=3, seed=0)
    assert len(a) == 15
    assert len(set(a)) == 15  # without replacement (the pool's sentences are all distinct)
    assert all(s in pool for s in a)
    assert few_shot_sample(pool, 5, 3, seed=0) == a
    assert few_shot_sample(pool, 5, 3, seed=1) != a
    assert len(few_shot_sample(pool, 25, 4, seed=0)) == 100  # the whole pool, each once
    with pytest.raises(ValueError, match="cannot sample 5 x 21 = 105 sentences from 100"):
        few_shot_sample(pool, 5, 21, seed=0)


# --- labels ----------------------------------------------------------------------------------

def test_labels():
    assert LABELS == ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC")
    data = [Sentence(("a", "b"), ("B-PER", "O")), Sentence(("c",), ("B-LOC",)),
            Sentence(("d",), ("I-MISC",))]
    assert entity_types(data) == ["LOC", "MISC", "PER"]
    assert label_set(data) == ("O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-PER", "I-PER")
    assert encode_tags(["O", "B-PER", "I-LOC"], LABELS) == [0, 1, 6]
    with pytest.raises(ValueError, match="B-MISC"):
        encode_tags(["B-MISC"], LABELS)


# --- readers ---------------------------------------------------------------------------------

def test_read_wikiann_fixture():
    sents = read_wikiann(FIXTURES / "wikiann_en.txt")
    assert sents == [
        Sentence(("Sioux", "Falls", "(", "South", "Dakota", ")"),
                 ("B-ORG", "I-ORG", "O", "B-LOC", "I-LOC", "O")),
        # Only the first colon separates the language: "en::" is ":", "en:Re:Birth" "Re:Birth".
        Sentence(("Tomb", ":", "Re:Birth", "by", "Anders"),
                 ("B-ORG", "I-ORG", "I-ORG", "O", "B-PER")),
    ]


def test_read_conll2003_fixture():
    sents = read_conll2003(FIXTURES / "conll2003.txt")
    assert sents == [
        Sentence(("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O")),
        Sentence(("Peter", "Blackburn"), ("B-PER", "I-PER")),
        Sentence(("Germany", "France", "Britain", "Ltd"), ("B-LOC", "B-LOC", "B-LOC", "B-ORG")),
    ]


@pytest.mark.parametrize("reader,text,line,match", [
    (read_wikiann, "en:a\tO\nen:b O\n", 2, "tab-separated"),
    (read_wikiann, "en:a\tO\n\nnoprefix\tO\n", 3, "lang:token"),
    (read_wikiann, "en:a\tPER\n", 1, "invalid tag 'PER'"),
    (read_conll2003, "-DOCSTART- -X- O O\n\nEU NNP I-ORG\n", 3, "4 space-separated"),
    (read_conll2003, "EU NNP I-NP I-ORG\nx NN I-NP Z-ORG\n", 2, "invalid tag 'Z-ORG'"),
])
def test_malformed_line_names_file_and_line(tmp_path, reader, text, line, match):
    path = tmp_path / "bad.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=match) as err:
        reader(path)
    assert f"{path}:{line}:" in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        read_wikiann(tmp_path / "nope")


def test_read_wikiann_shared_dev(shared_data):
    path = shared_data / "wikiann" / "en" / "dev"
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    sents = read_wikiann(path)
    assert len(sents) == 10000
    assert set(label_set(sents)) == set(LABELS)
    assert all(len(s.tokens) == len(s.tags) > 0 for s in sents)
    assert not any(t.startswith("en:") for s in sents for t in s.tokens)
