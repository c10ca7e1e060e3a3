"""The cuDNN-shaped API: a handle, descriptors, alpha/beta, arrays addressed through descriptors."""
