"""Constants of the activation formulas, shared by the float64 reference and the Triton kernels."""

import math

GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)  # sqrt(2/pi), tanh-form gelu
GELU_TANH_CUBIC = 0.044715
