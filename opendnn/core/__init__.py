"""Core: dtypes, descriptors, errors, handle, array interop, logging."""
