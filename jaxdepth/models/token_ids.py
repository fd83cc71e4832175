"""The token ids of this project's tokenizers."""

# The token ids of every tokenizer this project trains (data/corpus/tokenizer.py): T5's pad,
# eos and unk, then the encoders' [CLS], [SEP] and [MASK] as fixed user-defined symbols.
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
CLS_ID, SEP_ID, MASK_ID = 3, 4, 5
N_SPECIAL = 6  # ids below this are never drawn as MLM's random replacement tokens
