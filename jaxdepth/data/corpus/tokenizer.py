"""SentencePiece tokenizer trained in memory, with T5 ids (pad 0, eos 1, unk 2, no bos).

Encoders also need `[CLS]`, `[SEP]` and `[MASK]`; they are user-defined symbols so they get the
fixed ids 3, 4, 5 and are never split. A `Tokenizer` holds only the serialized model proto, so it
pickles (grain may send it to worker processes) and saves as an ordinary `.model` file.
"""
from __future__ import annotations

import io
import itertools
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

from ...errors import DataError, one_line
from ...files import write_whole
from ...models.token_ids import (CLS_ID, EOS_ID, MASK_ID, PAD_ID, SEP_ID,  # noqa: F401
                                  UNK_ID)  # (the layout)

SPECIAL_SYMBOLS = ("[CLS]", "[SEP]", "[MASK]")  # ids CLS_ID, SEP_ID, MASK_ID in this order

# SentencePiece silently drops training sentences longer than this many bytes (default 4192);
# web paragraphs (C4) are often longer, so raise the limit rather than lose them.
_MAX_SENTENCE_BYTES = 1 << 16

_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\).*<= (\d+)")
_TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


class Tokenizer:
    """A SentencePiece model, kept as its serialized proto bytes."""

    def __init__(self, model_proto: bytes):
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)

    # Pickle the bytes, not the C++ processor.
    def __getstate__(self) -> bytes:
        return self._proto

    def __setstate__(self, proto: bytes) -> None:
        self.__init__(proto)

    @property
    def model_proto(self) -> bytes:
        return self._proto

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def model_type(self) -> str:
        """The SentencePiece algorithm it was trained with: "unigram", "bpe", "word" or "char"."""
        from sentencepiece import sentencepiece_model_pb2 as pb
        proto = pb.ModelProto()
        proto.ParseFromString(self._proto)
        return pb.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type).lower()

    pad_id = PAD_ID
    eos_id = EOS_ID
    unk_id = UNK_ID
    cls_id = CLS_ID
    sep_id = SEP_ID
    mask_id = MASK_ID

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without an EOS (callers decide where documents end)."""
        return self._sp.encode(text)

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; padding is dropped, EOS does not end decoding."""
        return self._sp.decode([int(i) for i in ids if int(i) != PAD_ID])

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def count_unk(self, text: str) -> int:
        """Number of unk tokens in the encoding of `text` (a run of unknown characters is one)."""
        return sum(1 for i in self.encode(text) if i == UNK_ID)

    def save(self, path: str | Path) -> None:
        """Write the model to `path` atomically: through a temporary file in the same
        directory, renamed into place, so that a failed write (a full disk) leaves neither
        half a model nor the temporary file."""
        write_whole(path, self._proto)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer model not found: {path}")
        try:
            return cls(path.read_bytes())
        except (RuntimeError, OSError) as e:
            raise DataError(f"{path} is not a SentencePiece model ({one_line(e)})") from None


def _sentences(texts: Iterable[str]) -> Iterator[str]:
    # SentencePiece trains on lines; a document's newlines separate them.
    for text in texts:
        for line in text.split("\n"):
            if line.strip():
                yield line


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, model_type: str = "unigram", required_chars: str = "",
    source: str = "the training text", vocab_field: str = "model.vocab_size",
) -> Tokenizer:
    """Train a SentencePiece model on `texts` whose vocabulary has exactly `vocab_size` pieces.

    Training is deterministic (one thread, every sentence, no shuffling): the same texts and size
    give byte-identical models. `required_chars` are kept in the vocabulary even if the texts
    lack them, so text the tokenizer will meet later (e.g. logical forms) encodes without unk.
    `source` names the texts (files, a setting) in the DataError of texts it cannot train on,
    `vocab_field` the setting that asked for `vocab_size`.
    """
    sentences = _sentences(texts)
    first = next(sentences, None)
    if first is None:
        raise DataError(f"cannot train a tokenizer on an empty corpus ({source})")
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=itertools.chain([first], sentences),
            model_writer=writer,
            vocab_size=vocab_size,
            model_type=model_type,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            user_defined_symbols=list(SPECIAL_SYMBOLS),
            required_chars=required_chars,
            # Every character of the corpus: the 0.9995 default drops rare ones (COGS's capital
            # P, Q, Z...), and exact match cannot survive an unk in a name.
            character_coverage=1.0,
            hard_vocab_limit=True,
            num_threads=1,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            max_sentence_length=_MAX_SENTENCE_BYTES,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise DataError(_training_failure(str(e), vocab_size, source, vocab_field)) from None
    tok = Tokenizer(writer.getvalue())
    # model_type="char" ignores hard_vocab_limit and just stops at the number of characters.
    if tok.vocab_size != vocab_size:
        raise DataError(
            f"vocab_size={vocab_size} is too large for this corpus: training produced only "
            f"{tok.vocab_size} pieces; try vocab_size <= {tok.vocab_size}"
        )
    return tok


def _training_failure(message: str, vocab_size: int, source: str, vocab_field: str) -> str:
    """What SentencePiece's refusal means for the user's corpus and vocab_size, in one line."""
    too_high, too_small = _TOO_HIGH.search(message), _TOO_SMALL.search(message)
    if too_high:
        return (f"vocab_size={vocab_size} is too large for this corpus; "
                f"try vocab_size <= {too_high.group(2)}")
    if too_small:
        return (f"{vocab_field}={vocab_size} is too small for {source}: its characters and the "
                f"special pieces need at least {too_small.group(2)}")
    if "sentences_.empty()" in message:
        # The texts were not empty (checked above): SentencePiece skipped every line as longer
        # than max_sentence_length.
        return (f"cannot train a tokenizer on {source}: every line is longer than "
                f"{_MAX_SENTENCE_BYTES:,} bytes; break the text into lines or paragraphs")
    return f"SentencePiece cannot train a tokenizer on {source}: {one_line(message)}"
