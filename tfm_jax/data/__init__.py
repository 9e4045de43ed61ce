"""Input pipeline: sources (tfds, local folders), sentencepiece BPE, token-budget batching."""

from tfm_jax.config.data import default_data_config
from tfm_jax.data.batching import (
    TrainIterator,
    make_eval_batches,
    make_train_iterator,
    padding_efficiency,
)
from tfm_jax.data.sources import DataError, load_split_texts
from tfm_jax.data.tokenizer import Tokenizer, get_tokenizer

__all__ = [
    "DataError",
    "Tokenizer",
    "TrainIterator",
    "default_data_config",
    "get_tokenizer",
    "load_split_texts",
    "make_eval_batches",
    "make_train_iterator",
    "padding_efficiency",
]
