"""Scoring translations: sacreBLEU, chrF and the paper's tokenized BLEU (metrics.py), and the
evaluation of a whole split with its perplexity (evaluate.py)."""
