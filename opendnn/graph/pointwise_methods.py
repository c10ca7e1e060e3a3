"""One graph method per pointwise mode, named as cudnn-frontend's Python API names them.

Each adds one pointwise node whose inputs broadcast as NumPy's (missing leading dims are 1) and
returns its output. An operand may be a Python number: a scalar passed by value. Comparisons and
logical modes give 1.0 or 0.0 in the output's type (set a BOOLEAN data type to store booleans);
``binary_select(a, b, mask)`` is ``a`` where mask is nonzero, else ``b``. Activations take
torch's coefficients and defaults (elu's alpha 1, softplus's and swish's beta 1); relu, like
torch's, gives NaN for NaN. Backward modes take the incoming gradient (``loss``) and the forward
input, and give ``loss * f'(input)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opendnn import PointwiseMode

if TYPE_CHECKING:
    from opendnn.graph.tensor import Tensor

    Operand = Tensor | float | int


class PointwiseMethods:
    """The pointwise half of the builder; ``_pointwise`` adds the node."""

    def _pointwise(
        self,
        mode: PointwiseMode,
        operands: Sequence[Operand],
        name: str | None,
        coef: float | None = None,
        data_type: Any = None,
    ) -> Tensor:
        raise NotImplementedError

    # ---- arithmetic -----------------------------------------------------------------------------------

    def add(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.ADD, (a, b), name)

    def sub(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.SUB, (a, b), name)

    def mul(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.MUL, (a, b), name)

    def div(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.DIV, (a, b), name)

    def max(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        """Elementwise maximum; NaN in either gives NaN."""
        return self._pointwise(PointwiseMode.MAX, (a, b), name)

    def min(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        """Elementwise minimum; NaN in either gives NaN."""
        return self._pointwise(PointwiseMode.MIN, (a, b), name)

    def pow(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.POW, (a, b), name)

    def mod(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        """The remainder of a / b with a's sign (C's fmod)."""
        return self._pointwise(PointwiseMode.MOD, (a, b), name)

    def add_square(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        """a + b * b."""
        return self._pointwise(PointwiseMode.ADD_SQUARE, (a, b), name)

    def scale(self, input: Operand, scale: Operand, *, name: str | None = None) -> Tensor:
        """input * scale (cudnn-frontend's scale: a multiply, usually by a scalar or per channel)."""
        return self._pointwise(PointwiseMode.MUL, (input, scale), name)

    def bias(self, input: Operand, bias: Operand, *, name: str | None = None) -> Tensor:
        """input + bias (cudnn-frontend's bias: an add, usually per channel)."""
        return self._pointwise(PointwiseMode.ADD, (input, bias), name)

    # ---- mathematical ---------------------------------------------------------------------------------

    def neg(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.NEG, (input,), name)

    def abs(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.ABS, (input,), name)

    def exp(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.EXP, (input,), name)

    def log(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.LOG, (input,), name)

    def sqrt(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.SQRT, (input,), name)

    def rsqrt(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.RSQRT, (input,), name)

    def sin(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.SIN, (input,), name)

    def cos(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.COS, (input,), name)

    def tan(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.TAN, (input,), name)

    def erf(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.ERF, (input,), name)

    def floor(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.FLOOR, (input,), name)

    def ceil(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.CEIL, (input,), name)

    def reciprocal(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.RECIPROCAL, (input,), name)

    def identity(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.IDENTITY, (input,), name)

    def cast(self, input: Operand, data_type: Any, *, name: str | None = None) -> Tensor:
        """input converted to ``data_type`` (an identity node whose output has that type)."""
        return self._pointwise(PointwiseMode.IDENTITY, (input,), name, data_type=data_type)

    # ---- relational and logical -----------------------------------------------------------------------

    def cmp_eq(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.CMP_EQ, (a, b), name)

    def cmp_neq(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.CMP_NEQ, (a, b), name)

    def cmp_gt(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.CMP_GT, (a, b), name)

    def cmp_ge(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.CMP_GE, (a, b), name)

    def cmp_lt(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.CMP_LT, (a, b), name)

    def cmp_le(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.CMP_LE, (a, b), name)

    def logical_and(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        """Nonzero is true."""
        return self._pointwise(PointwiseMode.LOGICAL_AND, (a, b), name)

    def logical_or(self, a: Operand, b: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.LOGICAL_OR, (a, b), name)

    def logical_not(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.LOGICAL_NOT, (input,), name)

    def binary_select(self, a: Operand, b: Operand, mask: Operand, *, name: str | None = None) -> Tensor:
        """a where mask is nonzero, else b."""
        return self._pointwise(PointwiseMode.BINARY_SELECT, (a, b, mask), name)

    # ---- activations, forward and backward --------------------------------------------------------------

    def relu(self, input: Operand, upper_clip: float | None = None, *, name: str | None = None) -> Tensor:
        """max(input, 0), or min(max(input, 0), upper_clip) (relu6 for 6)."""
        if upper_clip is None:
            return self._pointwise(PointwiseMode.RELU_FWD, (input,), name)
        return self._pointwise(PointwiseMode.CLIPPED_RELU_FWD, (input,), name, coef=upper_clip)

    def relu_backward(
        self, loss: Operand, input: Operand, upper_clip: float | None = None, *, name: str | None = None
    ) -> Tensor:
        if upper_clip is None:
            return self._pointwise(PointwiseMode.RELU_BWD, (loss, input), name)
        return self._pointwise(PointwiseMode.CLIPPED_RELU_BWD, (loss, input), name, coef=upper_clip)

    def tanh(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.TANH_FWD, (input,), name)

    def tanh_backward(self, loss: Operand, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.TANH_BWD, (loss, input), name)

    def sigmoid(self, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.SIGMOID_FWD, (input,), name)

    def sigmoid_backward(self, loss: Operand, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.SIGMOID_BWD, (loss, input), name)

    def elu(self, input: Operand, alpha: float | None = None, *, name: str | None = None) -> Tensor:
        """input if input > 0 else alpha * (exp(input) - 1)."""
        return self._pointwise(PointwiseMode.ELU_FWD, (input,), name, coef=alpha)

    def elu_backward(
        self, loss: Operand, input: Operand, alpha: float | None = None, *, name: str | None = None
    ) -> Tensor:
        return self._pointwise(PointwiseMode.ELU_BWD, (loss, input), name, coef=alpha)

    def gelu(self, input: Operand, *, name: str | None = None) -> Tensor:
        """input * Phi(input), the erf form."""
        return self._pointwise(PointwiseMode.GELU_FWD, (input,), name)

    def gelu_backward(self, loss: Operand, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.GELU_BWD, (loss, input), name)

    def gelu_approx_tanh(self, input: Operand, *, name: str | None = None) -> Tensor:
        """gelu's tanh form (torch's approximate="tanh")."""
        return self._pointwise(PointwiseMode.GELU_APPROX_TANH_FWD, (input,), name)

    def gelu_approx_tanh_backward(self, loss: Operand, input: Operand, *, name: str | None = None) -> Tensor:
        return self._pointwise(PointwiseMode.GELU_APPROX_TANH_BWD, (loss, input), name)

    def softplus(self, input: Operand, beta: float | None = None, *, name: str | None = None) -> Tensor:
        """log(1 + exp(beta * input)) / beta."""
        return self._pointwise(PointwiseMode.SOFTPLUS_FWD, (input,), name, coef=beta)

    def softplus_backward(
        self, loss: Operand, input: Operand, beta: float | None = None, *, name: str | None = None
    ) -> Tensor:
        return self._pointwise(PointwiseMode.SOFTPLUS_BWD, (loss, input), name, coef=beta)

    def swish(self, input: Operand, beta: float | None = None, *, name: str | None = None) -> Tensor:
        """input * sigmoid(beta * input) (silu for beta 1)."""
        return self._pointwise(PointwiseMode.SWISH_FWD, (input,), name, coef=beta)

    def swish_backward(
        self, loss: Operand, input: Operand, beta: float | None = None, *, name: str | None = None
    ) -> Tensor:
        return self._pointwise(PointwiseMode.SWISH_BWD, (loss, input), name, coef=beta)

    def identity_backward(self, loss: Operand, input: Operand, *, name: str | None = None) -> Tensor:
        """loss (the derivative of the identity is 1)."""
        return self._pointwise(PointwiseMode.IDENTITY_BWD, (loss, input), name)
