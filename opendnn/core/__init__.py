"""Core: dtypes, descriptors, errors, handle, array interop, logging, the dispatch to backends, and what
every family's cuDNN-shaped and Pythonic calls share (the default handle, the caller's names in errors,
the reference backends' I/O, the sample records)."""
