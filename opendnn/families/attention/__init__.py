"""Scaled dot-product attention: forward and backward, cuDNN-shaped and Pythonic, NumPy and Triton."""
