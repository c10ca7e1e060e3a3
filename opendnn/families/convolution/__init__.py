"""Convolution forward, backward data, backward filter and backward bias, with the fused bias /
residual / activation epilogue and the algorithm queries."""
