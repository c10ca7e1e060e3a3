"""The Triton backend: GPU kernels (run on the CPU through Triton's interpreter when forced)."""
