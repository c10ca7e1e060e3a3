"""The parameters of an attention, without the tensors (cuDNN's SDPA attributes): the scale, the
causal mask and its diagonal alignment, the sliding window, the softcap and dropout. What each one
does to the scores is written in ``opendnn.families.attention.reference``."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from opendnn.core.errors import BadParam

MAX_SEED = 2**63 - 1
MAX_OFFSET = 2**62  # counters are offset + element index, and stay below 2**63


class DiagonalAlignment(enum.Enum):
    """Where the causal diagonal and the window sit when Sq != Skv (cuDNN's diagonal alignment)."""

    TOP_LEFT = "top_left"
    BOTTOM_RIGHT = "bottom_right"


@dataclass(frozen=True)
class AttentionDescriptor:
    """The parameters of an attention, without the tensors (cuDNN's SDPA attributes).

    Args:
        scale: what q . k is multiplied by; None for 1 / sqrt(D).
        causal: key j > query i takes no part (the window's right bound 0).
        alignment: DiagonalAlignment of the causal diagonal and the window.
        window: (left, right) keys around the diagonal taking part, each an int >= 0 or None (unbounded).
        softcap: s = softcap * tanh(s / softcap) before the bias; None for none.
        dropout_p: probability of dropping each attention weight, in [0, 1).
        seed: the Philox key, 0 to 2**63 - 1.
        offset: the first Philox counter, 0 to 2**62.

    Raises:
        BadParam: naming the field and the rule it broke.
    """

    scale: float | None = None
    causal: bool = False
    alignment: DiagonalAlignment | str = DiagonalAlignment.TOP_LEFT  # a name becomes its DiagonalAlignment
    window: tuple[int | None, int | None] = (None, None)
    softcap: float | None = None
    dropout_p: float = 0.0
    seed: int = 0
    offset: int = 0

    def __post_init__(self) -> None:
        if self.scale is not None and not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale)):
            raise BadParam(f"scale={self.scale!r} must be a finite number or None")
        if not isinstance(self.causal, bool):
            raise BadParam(f"causal={self.causal!r} must be a bool")
        alignments = [a.value for a in DiagonalAlignment]
        if not (isinstance(self.alignment, DiagonalAlignment) or self.alignment in alignments):
            raise BadParam(f"alignment={self.alignment!r} must be a DiagonalAlignment (TOP_LEFT or BOTTOM_RIGHT)")
        object.__setattr__(self, "alignment", DiagonalAlignment(self.alignment))
        window = self.window
        if not (
            isinstance(window, (tuple, list))
            and len(window) == 2
            and all(b is None or (isinstance(b, int) and not isinstance(b, bool) and b >= 0) for b in window)
        ):
            raise BadParam(f"window={window!r} must be a pair (left, right), each an int at least 0 or None")
        object.__setattr__(self, "window", tuple(window))
        if self.softcap is not None and not (isinstance(self.softcap, (int, float)) and 0 < self.softcap < math.inf):
            raise BadParam(f"softcap={self.softcap!r} must be positive and finite, or None")
        if not (isinstance(self.dropout_p, (int, float)) and 0.0 <= self.dropout_p < 1.0):
            raise BadParam(f"dropout_p={self.dropout_p!r} must be at least 0 and below 1")
        for name, value, limit, text in (
            ("seed", self.seed, MAX_SEED, "2**63 - 1"),
            ("offset", self.offset, MAX_OFFSET, "2**62"),
        ):
            if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value <= limit):
                raise BadParam(f"{name}={value!r} must be an int from 0 to {text}")
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "offset", int(self.offset))

    @property
    def band(self) -> tuple[int | None, int | None]:
        """(left, right) bounds around the diagonal, causal folded in (right at most 0)."""
        left, right = self.window
        if self.causal:
            right = 0
        return left, right

    def resolved_scale(self, head_dim: int) -> float:
        return float(self.scale) if self.scale is not None else 1.0 / math.sqrt(head_dim)
