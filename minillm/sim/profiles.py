"""The `Hardware` record and the datasheet GPUs (A100, H100, H200).

The bottom of the simulator: the cost model, the calibration and the operator
profiles read these records, and this module imports none of them;
`minillm.sim.hardware` adds this machine (`calibrate()`) on top.

A `Hardware` holds two kinds of numbers:

* the datasheet roofline: peak dense FLOP/s at the profile's dtype and memory
  bandwidth in bytes/s; their ratio is the ridge point (FLOPs per byte) above
  which a kernel is compute-bound;
* what real kernels reach, used by `minillm.cost_model`: the fraction of peak a
  large GEMM sustains, the fraction of bandwidth a weight-streaming GEMV
  sustains, the GEMM tile the M and N dimensions are padded to, a kernel-launch
  cost and a per-step overhead. For the A100 and H100 these were fitted once per
  GPU to measured operator times (see op_profiles.py for how); `calibrate()`
  fits them to the real engine's steps on the machine at hand (calibration.py).

Datasheets (dense, no sparsity; bf16 = the Tensor Core BF16 figure):
  A100: NVIDIA A100 Tensor Core GPU datasheet: 312 TFLOP/s bf16, 1,555 GB/s
        (40GB SXM), 2,039 GB/s (80GB SXM); 108 SMs.
  H100 SXM: NVIDIA H100 Tensor Core GPU datasheet: 989 TFLOP/s bf16
        (the 1,979 figure is with sparsity), 3.35 TB/s, 80 GB; 132 SMs.
  H200: NVIDIA H200 datasheet: 989 TFLOP/s bf16, 4.8 TB/s, 141 GB (the H100
        chip with HBM3e: the kernel factors are the H100's, not separately fitted).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property

from ..validation import check_choice, check_real

__all__ = ["Hardware", "PROFILES", "DTYPE_WIDTHS", "gpu_profile"]


# Bytes per element of the dtypes a profile names; the cost model's default width.
DTYPE_WIDTHS = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops_s: float                  # dense FLOP/s at `dtype` (datasheet or measured)
    mem_bandwidth_bytes_s: float         # bytes/s (datasheet or measured copy bandwidth)
    memory_bytes: float = 0.0            # device memory capacity
    dtype: str = "bfloat16"              # the dtype peak_flops_s refers to
    # ---- what real kernels reach (used by cost_model.predict_step) ----
    gemm_efficiency: float = 1.0         # fraction of peak a large, well-shaped GEMM sustains
    attention_efficiency: float = 1.0    # fraction of peak a flash-attention kernel sustains
    bandwidth_efficiency: float = 1.0    # fraction of bandwidth a weight-streaming GEMV sustains
    # fraction of bandwidth attention's K/V reads sustain; None: as bandwidth_efficiency.
    # On a CPU a decode reads its paged cache far below the machine's bandwidth (a
    # gather copy first, or a simple compiled kernel on one query row).
    attention_bandwidth_efficiency: float | None = None
    gemm_tile_m: int = 1                 # GEMM M (tokens) is padded to a multiple of this
    gemm_tile_n: int = 1                 # GEMM N (output features) padded to a multiple of this
    overlap_exponent: float = 1e9        # p in (t_compute^p + t_memory^p)^(1/p); huge = max()
    kernel_launch_s: float = 0.0         # fixed cost added to every kernel
    kernel_floor_s: float = 0.0          # no kernel is faster than this
    step_overhead_s: float = 0.0         # per step: scheduling, sampling, host work
    per_seq_overhead_s: float = 0.0      # per request in the step (a CPU attention loops over them)
    # ---- a GPU's GEMM tiles and waves, CUDA graphs and host launches (cost_model) ----
    num_sms: int = 0                     # streaming multiprocessors; 0: no waves, no CUDA graphs (a CPU)
    # (tile_m, tile_n, efficiency[, wave_quantization]) kernels the GEMM library picks from
    # (cost_model.gemm_tiling says how); () : the one tile (gemm_tile_m, gemm_tile_n,
    # gemm_efficiency). A kernel without its own wave_quantization uses the field below.
    gemm_tiles: tuple = ()
    wave_quantization: float = 0.0      # 0: a partial last wave costs its share; 1: a whole wave
    # the GEMM library takes the largest tile once it makes this many waves over the SMs
    # (cost_model.gemm_tiling); below that for every tile, the fastest tile
    gemm_fill_waves: float = 1.0
    # small memory-bound kernels (norms, RoPE, residual adds, the activation): their own
    # fraction of bandwidth and floor; None: bandwidth_efficiency plus kernel_launch_s
    elementwise_efficiency: float | None = None
    elementwise_floor_s: float = 0.0
    host_launch_s: float = 0.0           # host time to launch one kernel eagerly (PyTorch dispatch)
    graph_launch_s: float = 0.0          # host time to replay one captured CUDA graph
    source: str = ""                     # where the numbers come from

    def __post_init__(self):
        for arg in ("peak_flops_s", "mem_bandwidth_bytes_s"):
            check_real(arg, getattr(self, arg), 0, exclusive_minimum=True)
        check_real("wave_quantization", self.wave_quantization, 0, 1, hint="a fraction such as 0.5")
        for tile in self.gemm_tiles:
            if (not isinstance(tile, tuple) or len(tile) not in (3, 4)
                    or not all(int(t) == t and t >= 1 for t in tile[:2]) or not 0 < tile[2] <= 1
                    or (len(tile) == 4 and not 0 <= tile[3] <= 1)):
                raise ValueError(f"gemm_tiles={self.gemm_tiles!r}: give (tile_m, tile_n, efficiency) triples "
                                 "or (tile_m, tile_n, efficiency, wave_quantization), tiles whole numbers >= 1, "
                                 "efficiency in (0, 1], wave_quantization in [0, 1], e.g. ((128, 128, 0.7),)")
        for arg in ("gemm_efficiency", "attention_efficiency", "bandwidth_efficiency",
                    "attention_bandwidth_efficiency", "elementwise_efficiency"):
            check_real(arg, getattr(self, arg), 0, 1, exclusive_minimum=True, hint="a fraction such as 0.7",
                       allow_none=arg in ("attention_bandwidth_efficiency", "elementwise_efficiency"))
        # A name the widths do not know would count bytes at a guessed width.
        check_choice("dtype", self.dtype, DTYPE_WIDTHS, hint="the torch dtype's name without 'torch.'")

    @cached_property
    def tiles(self) -> tuple:
        """The (tile_m, tile_n, efficiency, wave_quantization) GEMM kernels this profile picks from."""
        tiles = self.gemm_tiles or ((self.gemm_tile_m, self.gemm_tile_n, self.gemm_efficiency),)
        return tuple(tuple(t) if len(t) == 4 else (*t, self.wave_quantization) for t in tiles)

    @cached_property
    def gemm_seconds_memo(self) -> dict:
        """(m, k, n, dtype_bytes) -> seconds: cost_model.gemm_time_s remembers each GEMM shape
        it priced on this (immutable) profile; a simulation asks for the same few thousand."""
        return {}

    @property
    def has_cuda_graphs(self) -> bool:
        """A GPU (num_sms > 0): steps can replay captured CUDA graphs."""
        return self.num_sms > 0

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of the dtype the profile was measured at (bfloat16: 2)."""
        return DTYPE_WIDTHS[self.dtype]

    @property
    def attention_bandwidth_bytes_s(self) -> float:
        """Bytes/s at which attention reads the KV cache."""
        eff = self.attention_bandwidth_efficiency
        return self.mem_bandwidth_bytes_s * (self.bandwidth_efficiency if eff is None else eff)

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte where the datasheet roofline turns from memory- to compute-bound."""
        return self.peak_flops_s / self.mem_bandwidth_bytes_s

    def attainable_flops_s(self, intensity: float) -> float:
        """The roofline: min(peak, bandwidth x intensity)."""
        return min(self.peak_flops_s, self.mem_bandwidth_bytes_s * intensity)

    def replace(self, **changes) -> "Hardware":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


_GB = 1e9
# Kernel factors fitted to the Vidur operator profiles: for each GPU,
#   op_profiles.fit_hardware_factors(<every file of the GPU>,
#       gpu_profile(name).replace(**op_profiles.NEUTRAL_START), trials=1800, seed=0)
# (every row, rows 1-4096; rounded to 3 digits). The tile kernels are 64x64, 128x128 and
# 128x256, each with its fitted fraction of peak and wave quantization; the GEMM takes the
# largest tile once it makes gemm_fill_waves waves over the SMs, else the fastest
# (cost_model.gemm_tiling). The A100-40GB shares the A100-80GB's chip, the H200 the
# H100's: their factors are carried over, not fitted. The legacy gemm_* fields are the
# 128x128 kernel (for readers that want one tile).
# Host side (ASSUMED, not fitted: the files hold no whole steps): 2 ms of host work per
# step (scheduling, input preparation, sampling, outputs), 10 us of host time per kernel
# launched eagerly (PyTorch's dispatch), 10 us per CUDA-graph replay.
_HOST = dict(step_overhead_s=2e-3, host_launch_s=10e-6, graph_launch_s=10e-6)
# The small kernels, fitted (grid search, rows 1-4096, all files of the GPU) to the measured
# norms + RoPE + residual add and the activation: a fraction of bandwidth and a 4 us floor,
# no per-kernel launch on top (in-stream launches overlap the previous kernel).
# Median |error| 6.9% (A100), 9.1% (H100).
_A100_FIT = dict(gemm_tiles=((64, 64, 0.716, 0.552), (128, 128, 0.753, 0.319), (128, 256, 0.752, 0.236)),
                 gemm_fill_waves=1.69, gemm_efficiency=0.753, gemm_tile_m=128, gemm_tile_n=128, num_sms=108,
                 attention_efficiency=0.5, bandwidth_efficiency=0.827, overlap_exponent=4.61,
                 kernel_launch_s=6.54e-6, kernel_floor_s=6.3e-7, elementwise_efficiency=0.46,
                 elementwise_floor_s=4e-6, **_HOST)
_H100_FIT = dict(gemm_tiles=((64, 64, 0.653, 0.866), (128, 128, 0.845, 0.686), (128, 256, 0.717, 0.244)),
                 gemm_fill_waves=1.12, gemm_efficiency=0.845, gemm_tile_m=128, gemm_tile_n=128, num_sms=132,
                 attention_efficiency=0.5, bandwidth_efficiency=0.910, overlap_exponent=3.83,
                 kernel_launch_s=6.16e-06, kernel_floor_s=2.3e-07, elementwise_efficiency=0.54,
                 elementwise_floor_s=4e-6, **_HOST)

PROFILES: dict[str, Hardware] = {
    "A100-40GB": Hardware("A100-40GB", 312e12, 1555 * _GB, 40 * 2**30, **_A100_FIT,
                          source="NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense, 1,555 GB/s"),
    "A100-80GB": Hardware("A100-80GB", 312e12, 2039 * _GB, 80 * 2**30, **_A100_FIT,
                          source="NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense, 2,039 GB/s (SXM)"),
    "H100-SXM": Hardware("H100-SXM", 989e12, 3350 * _GB, 80 * 2**30, **_H100_FIT,
                         source="NVIDIA H100 datasheet: 989 TFLOP/s bf16 dense, 3.35 TB/s (SXM)"),
    "H200": Hardware("H200", 989e12, 4800 * _GB, 141 * 2**30, **_H100_FIT,
                     source="NVIDIA H200 datasheet: 989 TFLOP/s bf16 dense, 4.8 TB/s"),
}


THIS_MACHINE_NAMES = ("cpu", "this", "calibrate")


def gpu_profile(hardware) -> Hardware:
    """A profile name ("A100-80GB", ...) or a Hardware object (returned as is).

    This machine ("cpu") is measured, not listed: `minillm.sim.hardware.get_hardware`
    resolves that name (it calibrates), and the simulator calls it.
    """
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str) and hardware in PROFILES:
        return PROFILES[hardware]
    if isinstance(hardware, str) and hardware.lower() in THIS_MACHINE_NAMES:
        raise ValueError(f"hardware={hardware!r}: this machine's profile is measured, not listed; "
                         "pass minillm.hardware.calibrate()'s Hardware object (or use simulate(), "
                         "which calibrates for 'cpu')")
    raise ValueError(f"hardware={hardware!r}: unknown; use one of {sorted(PROFILES)} "
                     "or a Hardware object such as minillm.hardware.calibrate()'s")
