"""Every layer of a bf16 decode step (one prompt or eight, with guidance) in one persistent CUDA launch (Hopper),
compiled at run time.

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
# the kernel's compile-time shapes (decode_layers.cu): v0.1 and v0.5 widths; one prompt with guidance (2 rows) or
# eight (16 rows), a kernel each
D, H, HD, F = 1536, 12, 128, 6144
KERNELS = {2: b"decode_layers_r2", 16: b"decode_layers_r16"}
CLUSTER = 4                     # CTAs a (row, head) attention pair
MIN_GRID = 120                  # gate/up stages a CTA at most 13 (2F / 8 rows over the grid); (row, head) pairs a
#                                 cluster (2 rows) or CTA (16 rows) at most ceil(pairs / 30 or 120)
MAX_SPLIT_SLOTS = 1280          # cache slots a CTA holds scores for (a quarter of a pair's with 2 rows, all with 16)
THREADS = 12 * 32      # 8 consumer warps and the producer warpgroup


def smem_bytes(rows: int) -> int:
    """The kernel's dynamic shared memory for `rows` (`Shape<R>::SMEM` in decode_layers.cu)."""
    stages = 8 if rows <= 2 else 6
    part = max(13 * 8 * rows * 8, 3 * HD + MAX_SPLIT_SLOTS + 16 * HD)
    splits = CLUSTER if rows <= 2 else 1                 # CTAs that share a (row, head) pair
    pairs = -(-rows * H // (MIN_GRID // splits))
    nsum = 4 * 8 * rows
    bars = -(-8 * (2 * stages + 1 + pairs) // 16) * 16
    return stages * 8 * (2 * D + 64) + bars + 4 * (part + 2 * nsum + 8 * 2 * rows + pairs * (splits - 1) * (HD + 2))


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
    """The compiled kernels on one device, with their scratch buffers and barrier counters (a counter per kernel and
    engine: it assumes every launch on it runs the same number of layers)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._drv = _driver()
        cubin = compile_cubin()
        self._fns: dict[int, ctypes.c_void_p] = {}
        clusters = []
        with torch.cuda.device(device):
            torch.cuda.synchronize(device)     # the primary context is current on this thread from here on
            self._module = ctypes.c_void_p()
            _check(self._drv, self._drv.cuModuleLoadData(ctypes.byref(self._module), cubin), "loading the cubin")
            for rows, name in KERNELS.items():
                fn = ctypes.c_void_p()
                _check(self._drv, self._drv.cuModuleGetFunction(ctypes.byref(fn), self._module, name),
                       f"finding {name.decode()}")
                _check(self._drv, self._drv.cuFuncSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                               smem_bytes(rows)), "setting its shared memory size")
                n = ctypes.c_int()
                config = self._config(rows, CLUSTER, None, pdl=False)
                _check(self._drv, self._drv.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn, ctypes.byref(config)),
                       "counting clusters")
                self._fns[rows] = fn
                clusters.append(n.value)
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.grid = CLUSTER * min([sms // CLUSTER] + clusters)
        if self.grid < MIN_GRID:
            raise GenerationError(f"decode_layers needs {MIN_GRID} resident CTAs, this device holds {self.grid}")
        rows = max(KERNELS)
        self.qkv = torch.empty(rows, 3 * D, dtype=torch.float32, device=device)
        self.attn = torch.empty(rows, D, dtype=torch.bfloat16, device=device)
        self.act = torch.empty(rows, F, dtype=torch.bfloat16, device=device)
        self.counters = {r: torch.zeros(2, dtype=torch.int64, device=device) for r in KERNELS}
        self._tables: dict[tuple[int, ...], Tensor] = {}
        self._n_layers: dict[int, int] = {}   # rows: the layer count its counter's launches run

    @classmethod
    def create(cls, device: torch.device) -> PersistentLayers | None:
        """The kernels for `device`, or None (with the reason logged) where they cannot run."""
        if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
            return None
        try:
            return cls(device)
        except (GenerationError, OSError) as e:
            log.warning("persistent decode layers unavailable, keeping the per-layer kernels: %s", e)
            return None

    @staticmethod
    def applies(x: Tensor, layers: Sequence[LayerWeights], cos: Tensor) -> bool:
        """Whether a kernel's compile-time shapes fit this step."""
        if x.shape[0] not in KERNELS or x.shape[1:] != (D,) or x.dtype != torch.bfloat16 or cos.shape[1] != HD // 2:
            return False
        for lw in layers:
            k = lw.cache.k
            if (lw.qkv_w.shape != (3 * D, D) or lw.gu_w.shape != (2 * F, D) or lw.down_w.shape != (D, F)
                    or k.shape[1:] != (H, k.shape[2], HD) or k.shape[0] < x.shape[0] or k.dtype != torch.bfloat16
                    or lw.qkv_w.dtype != torch.bfloat16
                    or k.shape[2] // (CLUSTER if x.shape[0] <= 2 else 1) + 1 > MAX_SPLIT_SLOTS):
                return False
        return True

    def _config(self, rows: int, grid: int, stream: int | None, pdl: bool) -> _LaunchConfig:
        attrs = (_LaunchAttribute * 2)()
        attrs[0].id = _CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        struct.pack_into("<3I", attrs[0].value, 0, CLUSTER, 1, 1)
        attrs[1].id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        struct.pack_into("<i", attrs[1].value, 0, 1)
        config = _LaunchConfig((grid, 1, 1), (THREADS, 1, 1), smem_bytes(rows), stream, attrs, 2 if pdl else 1)
        config._attrs = attrs          # keep the array alive with the config
        return config

    def _check_layer_count(self, rows: int, n: int) -> None:
        """A kernel's barrier counter targets assume every launch on it runs the same number of layers: a launch
        with another count would wait forever, so refuse it."""
        first = self._n_layers.setdefault(rows, n)
        if n != first:
            raise GenerationError(f"decode_layers: this instance runs {first} layers a launch for {rows} rows, not "
                                  f"{n}; use one PersistentLayers per layer count")

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
        """Runs every layer on x ([2 or 16, D] bf16, updated in place as the residual stream) at shape position
        `pos` ([1] int64 on the device); returns LayerNorm(x) after the last layer."""
        for t in (x, cos, sin):
            if not t.is_contiguous():
                raise GenerationError("decode_layers: x and the RoPE tables must be contiguous")
        rows = x.shape[0]
        self._check_layer_count(rows, len(layers))
        table = self._table(layers)
        h = torch.empty_like(x)
        params = struct.pack("<10Qi3f", table.data_ptr(), x.data_ptr(), h.data_ptr(), self.qkv.data_ptr(),
                             self.attn.data_ptr(), self.act.data_ptr(), pos.data_ptr(), cos.data_ptr(),
                             sin.data_ptr(), self.counters[rows].data_ptr(), len(layers), eps, qk_eps,
                             1 / math.sqrt(HD))
        buf = ctypes.create_string_buffer(params, len(params))
        args = (ctypes.c_void_p * 1)(ctypes.cast(buf, ctypes.c_void_p))
        config = self._config(rows, self.grid, torch.cuda.current_stream(self.device).cuda_stream, pdl)
        _check(self._drv, self._drv.cuLaunchKernelEx(ctypes.byref(config), self._fns[rows], args, None), "launching")
        return h
