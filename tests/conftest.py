"""Test set-up: Triton kernels run on CPU tensors through Triton's interpreter unless a GPU run
(``pytest -m gpu``) asks for compiled kernels. The variable must be set before triton loads."""

import os
import sys

if not any(arg.strip() in ("gpu", "-mgpu") for arg in sys.argv[1:]) and "-m gpu" not in " ".join(sys.argv):
    os.environ.setdefault("TRITON_INTERPRET", "1")
