import pickle
import random

import pytest

from jaxdepth.data.corpus.tokenizer import Tokenizer, train_tokenizer

WORDS = """the a cat dog bird fish horse mouse teacher student farmer doctor king queen child girl
boy sees likes finds helps follows paints chases watches loves hates carries throws eats drinks
reads writes big small red green happy quiet old young tall short brave clever lazy slow quick
gentle in on under near behind beside with without from into table garden river forest house
school market castle bridge mountain window kitchen book apple letter ball cake flower stone song
picture basket yesterday today often never always""".split()


def synthetic_sentences(n=200, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10))) for _ in range(n)]


@pytest.fixture(scope="module")
def sentences():
    return synthetic_sentences()


@pytest.fixture(scope="module")
def tok(sentences):
    return train_tokenizer(sentences, vocab_size=128)


def test_vocabulary_size_and_special_ids(tok):
    assert tok.vocab_size == 128
    assert (tok.pad_id, tok.eos_id, tok.unk_id) == (0, 1, 2)
    assert (tok.cls_id, tok.sep_id, tok.mask_id) == (3, 4, 5)
    assert [tok.id_to_piece(i) for i in range(6)] == [
        "<pad>", "</s>", "<unk>", "[CLS]", "[SEP]", "[MASK]",
    ]


def test_special_symbols_are_single_tokens(tok):
    # SentencePiece adds its dummy-prefix "▁" piece before a leading symbol.
    assert [tok.id_to_piece(i) for i in tok.encode("[CLS]")] == ["\u2581", "[CLS]"]
    ids = tok.encode("the [MASK] cat [SEP]")
    assert ids.count(5) == 1 and ids[-1] == 4
    assert tok.decode(ids) == "the [MASK] cat [SEP]"


def test_round_trip_on_training_sentences(tok, sentences):
    for s in sentences:
        ids = tok.encode(s)
        assert tok.eos_id not in ids  # encode never appends EOS
        assert tok.decode(ids) == s
    assert [tok.decode(ids) for ids in tok.encode_batch(sentences[:5])] == sentences[:5]


def test_decode_drops_pad_and_ignores_eos(tok):
    ids = tok.encode("the cat sees a dog")
    assert tok.decode([0, 0] + ids + [0]) == "the cat sees a dog"
    # EOS is a control piece: it decodes to nothing, and decoding goes on after it.
    assert tok.decode(ids + [1] + ids) == "the cat sees a dog the cat sees a dog"


def test_training_is_deterministic(sentences, tok):
    again = train_tokenizer(list(sentences), vocab_size=128)
    assert again.model_proto == tok.model_proto


def test_documents_with_newlines_train_like_their_lines(sentences, tok):
    docs = ["\n".join(sentences[i : i + 4]) for i in range(0, len(sentences), 4)]
    assert train_tokenizer(docs, vocab_size=128).model_proto == tok.model_proto


def test_save_load_and_pickle(tok, sentences, tmp_path):
    path = tmp_path / "spm.model"
    tok.save(path)
    assert path.read_bytes() == tok.model_proto
    for other in (Tokenizer.load(path), pickle.loads(pickle.dumps(tok))):
        assert other.vocab_size == 128
        assert other.encode_batch(sentences) == tok.encode_batch(sentences)


def test_unknown_characters(tok):
    # 'Z', 'é' and '你' never occur in the training text; a run of unknown characters is one unk.
    ids = tok.encode("the cat Zé 你")
    assert ids.count(tok.unk_id) == 2
    assert tok.count_unk("the cat Zé 你") == 2
    assert tok.count_unk("the cat") == 0
    assert tok.count_unk("Z the Z cat Z") == 3


def test_too_large_vocabulary_is_a_clear_error(sentences):
    with pytest.raises(ValueError, match=r"vocab_size=5000 is too large.*try vocab_size <= \d+"):
        train_tokenizer(sentences, vocab_size=5000)


def test_empty_training_corpus(sentences):
    with pytest.raises(ValueError, match="empty corpus"):
        train_tokenizer(["", "  \n "], vocab_size=128)


def test_load_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.model"
    with pytest.raises(FileNotFoundError, match="nope.model"):
        Tokenizer.load(missing)
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"this is not a protobuf")
    with pytest.raises(ValueError, match=r"garbage\.model is not a SentencePiece model"):
        Tokenizer.load(garbage)


def test_bpe_keeps_frequent_symbols_whole_where_unigram_splits_them(tmp_path):
    """data.tokenizer_type bpe: COGS-like logical forms at a small vocabulary. Unigram spends
    a lone '▁' piece before every symbol; BPE merges '▁(' and the like into one piece, so the
    same text is much shorter. run_tokenizer trains the type it is asked for."""
    from jaxdepth.config import ConfigError, DataConfig
    from jaxdepth.data.corpus.prepare import run_tokenizer

    rng = random.Random(0)
    lfs = [" ; ".join(f"* {rng.choice(WORDS)} ( x _ {rng.randint(1, 9)} )" for _ in range(3))
           for _ in range(400)]
    uni, bpe = train_tokenizer(lfs, 96), train_tokenizer(lfs, 96, "bpe")
    probe = "* cat ( x _ 3 ) ; * queen ( x _ 1 )"
    assert bpe.decode(bpe.encode(probe)) == probe
    assert len(bpe.encode(probe)) < 0.75 * len(uni.encode(probe))
    assert "▁(" in {bpe.id_to_piece(i) for i in bpe.encode(probe)}
    run = run_tokenizer(tmp_path, 96, True, texts=lambda: lfs, model_type="bpe")
    assert run.encode(probe) == bpe.encode(probe)
    assert (uni.model_type, bpe.model_type, run.model_type) == ("unigram", "bpe", "bpe")
    # A copied tokenizer is used as it is, and a setting that asks for another type is named.
    uni.save(tmp_path / "uni.model")
    with pytest.warns(UserWarning, match="a unigram tokenizer .*copied from task.init_from.*"
                                         "data.tokenizer_type=bpe"):
        copied = run_tokenizer(tmp_path / "copy", 96, True, model_type="bpe",
                               copy_from=(str(tmp_path / "uni.model"), "task.init_from"))
    assert copied.encode(probe) == uni.encode(probe)
    with pytest.raises(ConfigError, match="data.tokenizer_type"):
        DataConfig(tokenizer_type="wordpiece")
