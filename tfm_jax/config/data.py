"""Defaults for the `data` config section (sources, vocabulary, batching); config/defaults.py
includes them."""

import ml_collections
from ml_collections import config_dict


def default_data_config() -> ml_collections.ConfigDict:
    """Returns the `data` section; experiment configs override fields of it."""
    cfg = ml_collections.ConfigDict()
    # Where sentence pairs come from: "folder" reads `{dir}/{split}.{lang}` text files,
    # "tfds" reads a prepared tensorflow-datasets catalog entry (array_record, no TensorFlow).
    cfg.source = "folder"
    cfg.dir = "../shared/data/multi30k"
    cfg.tfds_name = "wmt14_translate/de-en"  # §5.1; "wmt14_translate/fr-en" for EN-FR
    cfg.tfds_data_dir = config_dict.placeholder(
        str
    )  # unset: tfds's default (~/tensorflow_datasets)
    # Direction is explicit: the model reads source_lang and writes target_lang (§5.1: en->de).
    cfg.source_lang = "en"
    cfg.target_lang = "de"
    # Split names as the source spells them, optionally sliced as tensorflow-datasets slices them
    # ("train[:50%]": the first half of the pairs, in a folder the first half of the lines). For
    # tfds WMT14: "train", "validation"
    # (newstest2013), "test" (newstest2014).
    cfg.train_split = "train"
    cfg.eval_split = "val"
    cfg.test_split = "test_2016_flickr"

    # §5.1 uses a shared BPE vocabulary of ~37000 on WMT14 EN-DE; 8000 suits Multi30k's 29k pairs.
    cfg.vocab_size = 8000
    cfg.vocab_path = config_dict.placeholder(str)  # unset: cached under `{workdir}/vocab/`
    cfg.vocab_sample_sentences = 2_000_000  # sentences (both languages) sampled to train BPE
    cfg.vocab_character_coverage = 1.0  # 0.9999 drops rare characters on large noisy corpora

    # §5.1: "each training batch contained ... approximately 25000 source tokens and 25000 target
    # tokens". Here a hard budget per side per global step on padded slots: B*S and B*T <= this.
    cfg.tokens_per_batch = 25000
    cfg.max_len = 256  # tokens per side including EOS; the paper does not state a limit
    cfg.overlong = "drop"  # training pairs longer than max_len: "drop" | "truncate"
    # BPE-dropout (Provilkov et al. 2020; not in the paper): each epoch re-segments the training
    # split with every BPE merge skipped with this probability (sentencepiece sampling), a
    # regularizer for small data. 0 = the deterministic segmentation, read from the token cache.
    # Evaluation and decoding always use the deterministic segmentation.
    cfg.bpe_dropout = 0.0
    cfg.num_buckets = 8  # distinct padded batch shapes without packing (one XLA compile each)
    cfg.length_multiple = 8  # padded lengths are multiples of this
    # Departure from §5.1 (which batches by approximate length only): pack several pairs into
    # each row, with segmentation/position arrays, to waste fewer padded slots.
    cfg.packing = False
    # Row length of the side with more tokens when packing; the other side's row length is
    # scaled by the training split's token ratio (both >= the longest kept sequence).
    cfg.packed_length = 256
    # Sentencepiece threads, and the processes that tokenize the training split into the cache.
    cfg.num_workers = 2
    # The training split tokenized once into memory-mapped .npy files (data/token_cache.py),
    # reused by later runs, resumes and hosts. Unset: `tokens/` beside the vocabulary model;
    # "" turns the cache off (every start tokenizes in memory). Hosts must share this folder.
    cfg.token_cache_dir = config_dict.placeholder(str)
    return cfg
