"""The run directory's data cache: reused when the data fields match, rebuilt when they don't."""
from pathlib import Path

import numpy as np
import pytest

from jaxdepth.config import ConfigError, DataConfig
from jaxdepth.data.corpus.prepare import prepare_lm_data


def test_cache_reused_only_for_the_same_data_fields(tmp_path: Path):
    cfg = DataConfig(grammar_docs=300, seq_len=16, batch_size=4)
    first = prepare_lm_data(cfg, 512, tmp_path, is_primary=True)
    train_file = tmp_path / "data" / "train.npy"
    mtime = train_file.stat().st_mtime_ns
    n_first = len(first.train)

    # window length and batch size do not change the cached streams
    again = prepare_lm_data(DataConfig(grammar_docs=300, seq_len=64, batch_size=8), 512, tmp_path, True)
    assert train_file.stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(again.train, first.train)

    # a different corpus is rebuilt, not silently replaced by the stale cache
    bigger = prepare_lm_data(DataConfig(grammar_docs=400, seq_len=16, batch_size=4), 512, tmp_path, True)
    assert len(bigger.train) > n_first
    assert train_file.stat().st_mtime_ns != mtime

    # an interrupted preparation (no stamp) is redone
    (tmp_path / "data" / "source.json").unlink()
    redone = prepare_lm_data(DataConfig(grammar_docs=400, seq_len=16, batch_size=4), 512, tmp_path, True)
    np.testing.assert_array_equal(redone.train, bigger.train)


def test_vocab_mismatch_with_given_tokenizer(tmp_path: Path):
    cfg = DataConfig(grammar_docs=300)
    prepare_lm_data(cfg, 512, tmp_path / "a", is_primary=True)
    tok = str(tmp_path / "a" / "data" / "tokenizer.model")
    with pytest.raises(ConfigError, match="model.vocab_size: 256"):
        prepare_lm_data(DataConfig(grammar_docs=300, tokenizer=tok), 256, tmp_path / "b", True)
