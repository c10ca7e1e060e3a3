"""Backends: ``numpy`` (the reference, runs anywhere) and ``triton`` (the GPU kernels)."""
