"""Every layer of a one-prompt bf16 decode step in one persistent CUDA launch (Hopper), compiled at run time.

`cuda/decode_layers.cu` holds the kernel and why it is one launch. This module compiles it with NVRTC (the library
torch's CUDA wheels install beside it), loads it through the driver API and launches it on torch's current stream,
so CUDA graphs capture it like any other kernel and no CUDA toolkit is needed. `PersistentLayers.create` returns
None where it cannot run (no NVRTC, not a Hopper chip, fewer resident clusters than the attention needs); the
engine then keeps its Triton kernels.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import math
import os
import struct
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from inference.errors import GenerationError
from inference.model import LayerWeights

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "cuda" / "decode_layers.cu"
# the kernel's compile-time shapes (decode_layers.cu): v0.1 and v0.5 widths, one prompt with guidance
D, H, HD, F, ROWS = 1536, 12, 128, 6144, 2
CLUSTER = 4                     # CTAs a (row, head) attention pair
MIN_GRID = 120                  # gate/up stages a CTA at most 13 (2F / 8 rows over the grid); 24 attention clusters
MAX_SPLIT_SLOTS = 1280          # cache slots one of the 4 splits holds in shared memory
# the kernel's dynamic shared memory: the ring's stages and mbarriers, x and a phase's activations, partial sums,
# a CTA pair's down sums, LayerNorm sums, the attention partials rank 0 merges (a test checks it against the kernel)
STAGES, SBP, AH, PB, MAXG, AP = 8, 8 * (2 * D + 64), 2 * D + 32, 13 * 8 * 16, 4, HD + 2
SMEM = STAGES * SBP + 16 * STAGES + 16 + ROWS * D * 2 + ROWS * AH * 2 + (PB + 2 * MAXG * 16 + 16 * ROWS + 3 * AP) * 4
THREADS = 9 * 32

_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("n_attrs", ctypes.c_uint)]


def _nvrtc_candidates() -> list[str]:
    """libnvrtc files: the NVIDIA wheels first (those of torch's CUDA major version before others), then a toolkit."""
    found: list[str] = []
    try:
        import nvidia

        for root in nvidia.__path__:
            found += glob.glob(os.path.join(root, "**", "libnvrtc.so*"), recursive=True)
    except ImportError:
        pass
    found += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    found = [p for p in found if "builtins" not in os.path.basename(p)]
    major = (torch.version.cuda or "").split(".")[0]
    return sorted(found, key=lambda p: f".so.{major}" not in os.path.basename(p))


def _load_nvrtc() -> ctypes.CDLL:
    errors = []
    for path in _nvrtc_candidates():
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise GenerationError("no loadable NVRTC library (install torch's CUDA wheels, which bring nvidia-cuda-nvrtc)"
                          + (f"; tried {errors}" if errors else ""))


def compile_cubin(arch: str = "sm_90a") -> bytes:
    """The kernel as a cubin for `arch`, compiled by NVRTC (no GPU needed: tests compile it on the CPU)."""
    lib = _load_nvrtc()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), SOURCE.read_bytes(), b"decode_layers.cu", 0, None, None):
        raise GenerationError("NVRTC could not create a program from decode_layers.cu")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        if rc:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            text = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, text)
            raise GenerationError(f"NVRTC could not compile decode_layers.cu for {arch}:\n"
                                  f"{text.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, cubin)
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _check(drv: ctypes.CDLL, rc: int, what: str) -> None:
    if rc:
        name = ctypes.c_char_p()
        drv.cuGetErrorString(rc, ctypes.byref(name))
        raise GenerationError(f"CUDA driver: {what} failed: {(name.value or b'').decode()} ({rc})")


class PersistentLayers:
    """The compiled kernel on one device, with its scratch buffers and barrier counters (one per engine: a counter
    assumes every launch on it runs the same number of layers)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._drv = _driver()
        cubin = compile_cubin()
        with torch.cuda.device(device):
            torch.cuda.synchronize(device)     # the primary context is current on this thread from here on
            self._module, self._fn = ctypes.c_void_p(), ctypes.c_void_p()
            _check(self._drv, self._drv.cuModuleLoadData(ctypes.byref(self._module), cubin), "loading the cubin")
            _check(self._drv, self._drv.cuModuleGetFunction(ctypes.byref(self._fn), self._module, b"decode_layers"),
                   "finding decode_layers")
            _check(self._drv, self._drv.cuFuncSetAttribute(self._fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                           SMEM), "setting its shared memory size")
            clusters = ctypes.c_int()
            config = self._config(CLUSTER, None, pdl=False)
            _check(self._drv, self._drv.cuOccupancyMaxActiveClusters(ctypes.byref(clusters), self._fn,
                                                                       ctypes.byref(config)), "counting clusters")
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.grid = CLUSTER * min(sms // CLUSTER, clusters.value)
        if self.grid < MIN_GRID:
            raise GenerationError(f"decode_layers needs {MIN_GRID} resident CTAs, this device holds {self.grid}")
        self.qkv = torch.empty(ROWS, 3 * D, dtype=torch.float32, device=device)
        self.attn = torch.empty(ROWS, D, dtype=torch.bfloat16, device=device)
        self.act = torch.empty(ROWS, F, dtype=torch.bfloat16, device=device)
        self.counter = torch.zeros(2, dtype=torch.int64, device=device)
        self._tables: dict[tuple[int, ...], Tensor] = {}
        self._n_layers: int | None = None

    @classmethod
    def create(cls, device: torch.device) -> PersistentLayers | None:
        """The kernel for `device`, or None (with the reason logged) where it cannot run."""
        if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
            return None
        try:
            return cls(device)
        except (GenerationError, OSError) as e:
            log.warning("persistent decode layers unavailable, keeping the per-layer kernels: %s", e)
            return None

    @staticmethod
    def applies(x: Tensor, layers: Sequence[LayerWeights], cos: Tensor) -> bool:
        """Whether the kernel's compile-time shapes fit this step."""
        if x.shape != (ROWS, D) or x.dtype != torch.bfloat16 or cos.shape[1] != HD // 2:
            return False
        for lw in layers:
            k = lw.cache.k
            if (lw.qkv_w.shape != (3 * D, D) or lw.gu_w.shape != (2 * F, D) or lw.down_w.shape != (D, F)
                    or k.shape[1:] != (H, k.shape[2], HD) or k.shape[0] < ROWS or k.dtype != torch.bfloat16
                    or lw.qkv_w.dtype != torch.bfloat16 or k.shape[2] // CLUSTER + 1 > MAX_SPLIT_SLOTS):
                return False
        return True

    def _config(self, grid: int, stream: int | None, pdl: bool) -> _LaunchConfig:
        attrs = (_LaunchAttribute * 2)()
        attrs[0].id = _CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        struct.pack_into("<3I", attrs[0].value, 0, CLUSTER, 1, 1)
        attrs[1].id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        struct.pack_into("<i", attrs[1].value, 0, 1)
        config = _LaunchConfig((grid, 1, 1), (THREADS, 1, 1), SMEM, stream, attrs, 2 if pdl else 1)
        config._attrs = attrs          # keep the array alive with the config
        return config

    def _check_layer_count(self, n: int) -> None:
        """The barrier counter's targets assume every launch on it runs the same number of layers: a launch with
        another count would wait forever, so refuse it."""
        if self._n_layers is None:
            self._n_layers = n
        elif n != self._n_layers:
            raise GenerationError(f"decode_layers: this instance runs {self._n_layers} layers a launch, not {n}; "
                                  "use one PersistentLayers per layer count")

    def _table(self, layers: Sequence[LayerWeights]) -> Tensor:
        """Each layer's pointers and cache geometry, as the kernel's LayerW: [layers, 14] int64 on the device."""
        rows = [[t.data_ptr() for t in (lw.qkv_w, lw.qkv_b, lw.q_norm, lw.k_norm, lw.proj_w, lw.proj_b, lw.gu_w,
                                         lw.gu_b, lw.down_w, lw.down_b, lw.cache.k, lw.cache.v)]
                + [lw.cache.k.shape[2], lw.offset] for lw in layers]
        key = tuple(v for row in rows for v in row)
        if key not in self._tables:
            if torch.cuda.is_current_stream_capturing():
                raise GenerationError("decode_layers: run a step before capturing it (its layer table is built then)")
            self._tables[key] = torch.tensor(rows, dtype=torch.int64, device=self.device)
        return self._tables[key]

    def __call__(self, x: Tensor, pos: Tensor, layers: Sequence[LayerWeights], cos: Tensor, sin: Tensor,
                 eps: float, qk_eps: float, pdl: bool) -> Tensor:
        """Runs every layer on x ([2, D] bf16, updated in place as the residual stream) at shape position `pos`
        ([1] int64 on the device); returns LayerNorm(x) after the last layer."""
        for t in (x, cos, sin):
            if not t.is_contiguous():
                raise GenerationError("decode_layers: x and the RoPE tables must be contiguous")
        self._check_layer_count(len(layers))
        table = self._table(layers)
        h = torch.empty_like(x)
        params = struct.pack("<10Qi3f", table.data_ptr(), x.data_ptr(), h.data_ptr(), self.qkv.data_ptr(),
                             self.attn.data_ptr(), self.act.data_ptr(), pos.data_ptr(), cos.data_ptr(),
                             sin.data_ptr(), self.counter.data_ptr(), len(layers), eps, qk_eps, 1 / math.sqrt(HD))
        buf = ctypes.create_string_buffer(params, len(params))
        args = (ctypes.c_void_p * 1)(ctypes.cast(buf, ctypes.c_void_p))
        config = self._config(self.grid, torch.cuda.current_stream(self.device).cuda_stream, pdl)
        _check(self._drv, self._drv.cuLaunchKernelEx(ctypes.byref(config), self._fn, args, None), "launching")
        return h
