"""Batch normalization: training and inference forward, backward, the Ex forms with add + activation."""
