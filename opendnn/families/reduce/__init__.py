"""Tensor reduction (reduce_tensor): add, mul, min, max, amax, avg, norm1, norm2, mul-no-zeros, with indices."""
