"""Layer, RMS, group and instance normalization, forward (training and inference) and backward."""
