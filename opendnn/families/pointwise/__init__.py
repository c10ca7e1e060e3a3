"""Pointwise operations: activations, arithmetic, math, comparisons and logic, op_tensor, add / scale /
set / transform_tensor and gen_index, one strided elementwise kernel."""
