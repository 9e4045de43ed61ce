"""Special token ids shared by the vocabulary, the model and decoding.

The sentencepiece model is trained with exactly these ids (see tfm_jax/data/tokenizer.py), so
the model and the decoder can use them without loading a vocabulary.
"""

PAD_ID = 0  # padding; never a target, masked out of attention and the loss
EOS_ID = 1  # ends every source and target sequence
BOS_ID = 2  # first decoder input (targets shifted right by one)
UNK_ID = 3  # out-of-vocabulary piece
