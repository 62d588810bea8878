"""Comparing floats bit for bit (chapter 11): how many elements differ, by how many ulps.

An ulp (unit in the last place) is the gap between a float and the next one of its
dtype. Reading a float's bits as a sign-magnitude integer and turning that into an
ordered integer (negatives mirrored below zero) makes neighbouring floats neighbouring
integers, so the distance in ulps is a subtraction: 0 means the same value (+0 and -0
included), 1 the next float up or down.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
             torch.float64: torch.int64}


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """Each float as an integer that grows with it, in int64 (float64: its own int64)."""
    if x.dtype not in _INT_VIEW:
        raise TypeError(f"dtype={x.dtype}: must be one of {sorted(str(d) for d in _INT_VIEW)}")
    bits = x.contiguous().view(_INT_VIEW[x.dtype]).to(torch.int64)
    sign_bit = 1 << (8 * x.element_size() - 1)
    if x.dtype == torch.float64:               # no wider integer: mirror within int64
        return torch.where(bits < 0, -(bits & (sign_bit - 1)), bits)
    magnitude = bits & (sign_bit - 1)
    return torch.where(bits < 0, -magnitude, magnitude)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise |a - b| in ulps of their dtype (int64): 0 for equal values."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"a {a.dtype}{list(a.shape)} and b {b.dtype}{list(b.shape)}: need one dtype and shape")
    return (_ordered(a) - _ordered(b)).abs()


@dataclass
class BitDifference:
    """What differs between two results of the same computation: how many elements, by
    how many ulps each (median of those that differ), and the largest difference in ulps
    of the tensor's largest magnitude (an element near zero has tiny ulps, so its own
    ulp count can be large for a difference that is small on the tensor's scale)."""
    num_elements: int
    num_differ: int
    median_ulps: int
    scale_ulps: float

    def __str__(self) -> str:
        if not self.num_differ:
            return f"bit-identical ({self.num_elements:,} elements)"
        return (f"{self.num_differ:,} of {self.num_elements:,} differ ({self.num_differ / self.num_elements:.0%}), "
                f"median {self.median_ulps:,} ulps, at most {self.scale_ulps:.3g} ulps of the largest value")


def bit_difference(a: torch.Tensor, b: torch.Tensor) -> BitDifference:
    a, b = a.detach(), b.detach()
    ulps = ulp_distance(a, b)
    differ = ulps[ulps > 0]
    scale = b.abs().max().double()
    spacing = (torch.nextafter(scale, torch.tensor(float("inf"), dtype=torch.float64)) - scale
               if b.dtype == torch.float64 else torch.tensor(torch.finfo(b.dtype).eps, dtype=torch.float64) * scale)
    gap = (a.double() - b.double()).abs().max() if a.numel() else torch.tensor(0.0, dtype=torch.float64)
    return BitDifference(a.numel(), differ.numel(), int(differ.median()) if differ.numel() else 0,
                         float(gap / spacing) if scale > 0 else 0.0)
