"""The engine's attention (decode steps and prefills) in a small C kernel, compiled on first use here.

PyTorch's CPU attention (``scaled_dot_product_attention``'s flash kernel) works in tiny matrix
products, each a BLAS call. For a decode step (per row and key/value head: 3 query heads x 64 against
64 x W cached keys on SmolLM2) that ran at about 18 GB/s on the AMD machine of round 5, where a plain
``sum`` reads the same cache at 50 GB/s: 17-18 ms of a 51 ms batch-16 step. For a 16 x 400 prefill it
took 1.18 s of 4.25 s (docs/engines.md). ``native/attention.c`` has two entry points:

- a decode step reads each (row, head) pair's keys and values once, in order, with the softmax in
  between: memory-bound, as it should be (9-10 ms for that step's 309 MB);
- a prefill takes the queries of a pair in tiles of 16, keeps a tile's scores whole, and runs its
  products as broadcast multiply-adds on 16-float vectors (3.4x PyTorch's time on a 16 x 400 prefill's
  layer), skipping the keys no query of the tile attends to.

Both split their work over OpenMP threads, as many as ``torch.get_num_threads()``. The kernel is
compiled with the system's C compiler (``$CC`` or ``cc``; ``-O3 -march=native -fopenmp``), once per
source, compiler and CPU, into agentboost's cache (``$AGENTBOOST_HOME/kernels``, written under a
temporary name and renamed into place), and loaded with :mod:`ctypes` after PyTorch, so that it shares
PyTorch's OpenMP runtime and its threads (tested). Where it cannot be built (no compiler, no OpenMP, a
CPU the compiler does not know) or ``AGENTBOOST_NATIVE_ATTENTION=0`` is set, :func:`attend` and
:func:`prefill` return None and the caller keeps PyTorch's attention; :func:`status` says why, and the
reason is logged once.

They take only what they are exact for: fp32 CPU tensors whose head dimension is contiguous, keys and
values of equal strides, boolean masks (or, for a prefill, none and causal), and for a prefill mask rows
that are one run of attended positions with at most one hole (causal, padded, the engine's prefix-cache
rows) and heads of 64 or 128. Anything else returns None. Results agree with PyTorch's to float
rounding (a different summation order; tests/engines/test_native_attention.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from agentboost.errors import BuildError

logger = logging.getLogger(__name__)

SOURCES = (
    Path(__file__).with_name("native") / "attention.c",
    Path(__file__).with_name("native") / "layers.c",
)
"""Built together into one library: the attention, and the direct forward's norm and rotary embedding."""
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared")
ENVIRONMENT_SWITCH = "AGENTBOOST_NATIVE_ATTENTION"
"""Set to ``0`` to keep PyTorch's attention for decode steps."""

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_reason: str | None = None  # why the kernel is not in use, once a load was tried
_tried = False
calls = 0
"""Decode-step layers attended by the kernel in this process (a counter for tests and benchmarks)."""
prefill_calls = 0
"""Prefill layers attended by the kernel in this process."""


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags (Linux), else the platform's words."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    wanted = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(sorted(set(wanted))) or f"{platform.machine()} {platform.processor()}"


def _compiler() -> str:
    return os.environ.get("CC") or "cc"


def library_path(cache: Path | None = None) -> Path:
    """Where this source, compiler and CPU's build lives (whether or not it was built yet)."""
    from agentboost.models.weights import cache_dir

    compiler = _compiler()
    resolved = shutil.which(compiler) or compiler
    key = hashlib.sha256()
    sources = [source.read_bytes() for source in SOURCES]
    for part in (*sources, resolved.encode(), " ".join(FLAGS).encode(), _cpu_signature().encode()):
        key.update(part)
        key.update(b"\0")
    return (cache or cache_dir() / "kernels") / f"attention-{key.hexdigest()[:16]}.so"


def build(cache: Path | None = None) -> Path:
    """Compile the kernel unless this build is already cached; its path. Raises :class:`BuildError`."""
    target = library_path(cache)
    if target.exists():
        return target
    compiler = _compiler()
    if shutil.which(compiler) is None:
        raise BuildError(f"no C compiler: {compiler!r} is not on PATH (set $CC to one)")
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=target.stem + ".", suffix=".partial", dir=target.parent)
    os.close(handle)
    try:
        result = subprocess.run(
            [compiler, *FLAGS, "-o", partial, *map(str, SOURCES)], capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            raise BuildError(f"{compiler} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        os.replace(partial, target)  # atomic: another process building the same kernel is harmless
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"{compiler} could not run: {error}") from error
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def _load() -> ctypes.CDLL | None:
    global _library, _reason, _tried
    with _lock:
        if _tried:
            return _library
        _tried = True
        if os.environ.get(ENVIRONMENT_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
            _reason = f"disabled by {ENVIRONMENT_SWITCH}"
            return None
        try:
            library = ctypes.CDLL(str(build()))
            function = library.agentboost_decode_attention_f32
            for name in (
                "agentboost_prefill_attention_f32",
                "agentboost_rms_norm_f32",
                "agentboost_rotary_f32",
            ):
                getattr(library, name)  # every entry point, or none
        except (BuildError, OSError, AttributeError) as error:
            _reason = f"not built: {error}"
            logger.warning("decode steps keep PyTorch's attention; the native kernel is %s", _reason)
            return None
        i64, ptr, c_int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        function.argtypes = [ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr, i64, ptr]
        function.argtypes += [c_int] * 5 + [ctypes.c_float, c_int]
        function.restype = c_int
        prefill = library.agentboost_prefill_attention_f32
        prefill.argtypes = [ptr, i64, i64, i64, ptr, ptr, i64, i64, i64, ptr, i64, i64, ptr]
        prefill.argtypes += [c_int] * 6 + [ctypes.c_float, c_int]
        prefill.restype = c_int
        norm = library.agentboost_rms_norm_f32
        norm.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_float, ptr, i64, c_int]
        norm.restype = None
        rotary = library.agentboost_rotary_f32
        rotary.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, i64, c_int]
        rotary.restype = None
        _library = library
        return _library


def status() -> str:
    """``"loaded"``, or why the kernel is not used (tries to load it first)."""
    return "loaded" if _load() is not None else str(_reason)


def available() -> bool:
    return _load() is not None


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor | None:
    """One decode step's attention, ``[B, 1, heads, D]``, or None where the kernel does not apply.

    ``query`` is ``[B, heads, 1, D]``; ``key``/``value`` ``[B, kv_heads, W, D]`` (views of wider
    buffers are fine); ``mask`` a boolean ``[B, 1, 1, W]``, True where a position is attended, or None.
    Query head ``h`` reads key/value head ``h // (heads // kv_heads)``.
    """
    batch, heads, length, head_dim = query.shape
    width = key.shape[2]
    if length != 1 or not _takes(query, key, value):
        return None
    mask = _boolean_mask(mask, (batch, 1, 1, width))
    if mask is False:
        return None
    library = _load()
    if library is None:
        return None
    out = query.new_empty((batch, 1, heads, head_dim))
    with _profiled("agentboost::native_decode_attention"):
        return _call(library, query, key, value, mask, out, scale)


def _call(
    library: ctypes.CDLL,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    global calls
    batch, heads, _, head_dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    failed = library.agentboost_decode_attention_f32(
        query.data_ptr(),
        query.stride(0),
        query.stride(1),
        key.data_ptr(),
        value.data_ptr(),
        key.stride(0),
        key.stride(1),
        key.stride(2),
        mask.data_ptr() if mask is not None else None,
        mask.stride(0) if mask is not None else 0,
        out.data_ptr(),
        batch,
        kv_heads,
        heads // kv_heads,
        width,
        head_dim,
        scale,
        torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("the native decode attention could not allocate its scratch memory")
    calls += 1
    return out


def prefill(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    *,
    is_causal: bool = False,
) -> torch.Tensor | None:
    """A prefill's attention, ``[B, L, heads, D]``, or None where the kernel does not apply.

    ``query`` is ``[B, heads, L, D]``; ``key``/``value`` ``[B, kv_heads, W, D]``; ``mask`` a boolean
    ``[B, 1, L, W]`` whose every row is one run of attended positions with at most one hole in it (the
    kernel checks, and declines others), or None with ``is_causal`` and ``L == W``. Head dimensions of
    64 and 128 only.
    """
    batch, heads, length, head_dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    if head_dim not in (64, 128) or length == 0 or not _takes(query, key, value):
        return None
    if mask is None and (not is_causal or length != width):
        return None
    mask = _boolean_mask(mask, (batch, 1, length, width))
    if mask is False:
        return None
    library = _load()
    if library is None:
        return None
    global prefill_calls
    out = query.new_empty((batch, length, heads, head_dim))
    with _profiled("agentboost::native_prefill_attention"):
        status = library.agentboost_prefill_attention_f32(
            query.data_ptr(),
            query.stride(0),
            query.stride(1),
            query.stride(2),
            key.data_ptr(),
            value.data_ptr(),
            key.stride(0),
            key.stride(1),
            key.stride(2),
            mask.data_ptr() if mask is not None else None,
            mask.stride(0) if mask is not None else 0,
            mask.stride(2) if mask is not None else 0,
            out.data_ptr(),
            batch,
            kv_heads,
            heads // kv_heads,
            length,
            width,
            head_dim,
            scale,
            torch.get_num_threads(),
        )
    if status == 1:
        raise MemoryError("the native prefill attention could not allocate its scratch memory")
    if status:
        return None  # a mask row of another shape: PyTorch's attention
    prefill_calls += 1
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """``weight * (x * rsqrt(mean(x**2, -1) + eps))`` in one pass (``native/layers.c``), or None where
    the kernel does not apply (not fp32 on CPU, a strided last dimension, no kernel)."""
    dim = x.shape[-1]
    if not _plain(x, weight) or weight.shape != (dim,) or not weight.is_contiguous() or x.numel() == 0:
        return None
    rows = x.reshape(-1, dim)  # a view for the engine's tensors; a copy otherwise
    library = _load()
    if library is None:
        return None
    out = torch.empty_like(rows)
    with _profiled("agentboost::native_rms_norm"):
        library.agentboost_rms_norm_f32(
            rows.data_ptr(),
            rows.shape[0],
            dim,
            rows.stride(0),
            weight.data_ptr(),
            eps,
            out.data_ptr(),
            out.stride(0),
            torch.get_num_threads(),
        )
    return out.view(x.shape)


def rotary(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Rotate ``query`` and ``key`` (``[B, S, heads, D]``, heads and ``D`` laid out plainly) in place by
    transformers' ``apply_rotary_pos_emb`` with ``cos``/``sin`` ``[B, S, D]``, to the bit; False (both
    untouched) where the kernel does not apply to both."""
    if not (_rotates(query, cos, sin) and _rotates(key, cos, sin)):
        return False
    library = _load()
    if library is None:
        return False
    with _profiled("agentboost::native_rotary"):
        for x in (query, key):
            batch, length, heads, dim = x.shape
            library.agentboost_rotary_f32(
                x.data_ptr(),
                batch * length,
                heads,
                dim,
                x.stride(1),
                dim,
                cos.data_ptr(),
                sin.data_ptr(),
                dim,
                torch.get_num_threads(),
            )
    return True


def _rotates(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    if x.dim() != 4 or cos.shape != (*x.shape[:2], x.shape[3]) or sin.shape != cos.shape or x.numel() == 0:
        return False
    _, length, _, dim = x.shape
    return (
        _plain(x, cos, sin)
        and dim % 2 == 0
        and x.stride(2) == dim
        and x.stride(0) == length * x.stride(1)
        and cos.is_contiguous()
        and sin.is_contiguous()
    )


def _plain(*tensors: torch.Tensor) -> bool:
    """fp32 CPU tensors with a contiguous last dimension."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.stride(-1) == 1 for t in tensors)


def _takes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """fp32 CPU tensors, ``[B, heads, L, D]`` against ``[B, kv_heads, W, D]`` keys and values of equal
    shapes and strides, whole groups of query heads, and contiguous head dimensions."""
    batch, heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    return (
        all(t.dtype == torch.float32 and t.device.type == "cpu" for t in (query, key, value))
        and kv_heads > 0
        and heads % kv_heads == 0
        and key.shape == value.shape
        and key.shape[0] == batch
        and key.shape[2] > 0
        and key.shape[3] == head_dim
        and key.stride() == value.stride()
        and key.stride(3) == 1
        and query.stride(3) == 1
    )


def _boolean_mask(mask: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor | bool | None:
    """The mask with contiguous rows (None stays None), or False when it is not a boolean of ``shape``."""
    if mask is None:
        return None
    if mask.dtype != torch.bool or mask.shape != shape:
        return False
    return mask if mask.stride(3) == 1 else mask.contiguous()


def _profiled(name: str) -> contextlib.AbstractContextManager[object]:
    """Named in torch.profiler's tables while profiling (a C call is no operator); free otherwise."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()
