"""Kernels: the Triton pieces no family owns (launch, layout, device, math, indexing, activation)."""
