"""The operation families: one folder each, holding the problem (rules and float64 reference), the
NumPy and Triton backends, the cuDNN-shaped and Pythonic calls, and the samples."""
