"""Word -> sub-token ids for the fusion tasks, whatever tokenizer the backbone came with.

NER data is pre-split into words; each word's pieces are looked up separately so that the first
piece of a word can carry its label. Two sources:

- ``SentencePieceWords``: a run's SentencePiece model (``[CLS] [SEP] [MASK]`` at ids 3, 4, 5);
  a word is encoded on its own, so it gets SentencePiece's word-initial ``▁``.
- ``HFWords``: a Hugging Face ``tokenizer.json`` read with the optional ``tokenizers`` package;
  the sentence is encoded as pre-split words (``is_pretokenized``), so BERT WordPiece and
  RoBERTa byte-level BPE both see the word boundaries they were trained with.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from .tokenizer import PAD_ID, UNK_ID, Tokenizer


class SentencePieceWords:
    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.vocab_size = tok.vocab_size
        self.cls_id, self.sep_id, self.mask_id = tok.cls_id, tok.sep_id, tok.mask_id
        self.pad_id, self.unk_id = PAD_ID, UNK_ID

    def word_ids(self, words: Sequence[str]) -> list[list[int]]:
        return [self.tok.encode(w) or [self.unk_id] for w in words]


_SPECIALS = {"cls": ("[CLS]", "<s>"), "sep": ("[SEP]", "</s>"), "pad": ("[PAD]", "<pad>"),
             "mask": ("[MASK]", "<mask>"), "unk": ("[UNK]", "<unk>")}


class HFWords:
    def __init__(self, directory: str | Path):
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"task.init_from: no tokenizer.json in {directory}")
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise ImportError("reading a Hugging Face tokenizer.json needs the optional "
                              "'tokenizers' package: pip install 'jaxdepth[hf]'") from None
        self.tok = HFTokenizer.from_file(str(path))
        # A tokenizer.json may carry padding / truncation settings (sentence-transformers'
        # pad and cut at 128): pieces are placed by the callers, and words are never dropped.
        self.tok.no_padding()
        self.tok.no_truncation()
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        for role, names in _SPECIALS.items():
            ids = [self.tok.token_to_id(n) for n in names if self.tok.token_to_id(n) is not None]
            if not ids:
                raise ValueError(f"{path}: no {role} token (looked for {', '.join(names)})")
            setattr(self, f"{role}_id", ids[0])

    def word_ids(self, words: Sequence[str]) -> list[list[int]]:
        if not words:
            return []
        enc = self.tok.encode(list(words), is_pretokenized=True, add_special_tokens=False)
        out: list[list[int]] = [[] for _ in words]
        for piece, w in zip(enc.ids, enc.word_ids):
            if w is not None:
                out[w].append(piece)
        return [p or [self.unk_id] for p in out]

    # What data/corpus/mlm_sop.py needs to build MLM examples from this vocabulary.

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def word_start_table(self) -> np.ndarray:
        """bool [vocab]: WordPiece continues a word with "##"; byte-level BPE and SentencePiece
        vocabularies mark a word's first piece with "Ġ" / "▁"."""
        wordpiece = type(self.tok.model).__name__ == "WordPiece"
        table = np.zeros(self.vocab_size, bool)
        for piece, i in self.tok.get_vocab(with_added_tokens=True).items():
            table[i] = (not piece.startswith("##") if wordpiece
                        else piece.startswith(("\u0120", "\u2581")))
        return table

    @property
    def first_random_id(self) -> int:
        """Random MLM replacements are drawn above the leading special ids (BERT: [PAD],
        [unused*], [UNK], [CLS], [SEP]; RoBERTa: <s>, <pad>, </s>, <unk>)."""
        return max(self.cls_id, self.sep_id, self.pad_id, self.unk_id) + 1
