"""Cross-channel local response normalization (LRN) and divisive normalization (LCN), forward and backward."""
