"""Figures: attention heatmaps of one sentence (attention.py) and learning curves (curves.py)."""
