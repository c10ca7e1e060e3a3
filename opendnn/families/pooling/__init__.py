"""Pooling forward and backward: max, deterministic max, average including or excluding padding."""
