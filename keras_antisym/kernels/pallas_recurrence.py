"""The AntisymmetricRNN recurrence as one Pallas kernel (JAX), forward and backward.

`recurrence(u, mt, h0, epsilon, gated)` runs all `T` Euler steps

    a_t = h_{t-1}·Mt + u_t            (each of the `k` blocks of `u_t`)
    h_t = h_{t-1} + ε·tanh(a_t)                   ungated (k = 1)
    h_t = h_{t-1} + ε·σ(a_t^z)⊙tanh(a_t^c)        gated (k = 2, `u_t = [z | c]`)

in one kernel: one program owns a tile of `BLOCK_BATCH` batch rows, keeps
`Mt` on chip and loops over `T` inside the kernel. Shapes are row-major and
batch-major, as in the fused layers: `u (B, T, k·n)`, `mt (n, n)` (the
layers' `recurrent_operand()`), `h0 (B, n)`; it returns `H (B, T, n)`.

The gradient (`jax.custom_vjp`): the forward kernel also stores the slopes
`ε·∂rate/∂a_t` (`(B, T, k·n)`); the backward kernel runs the reverse
recurrence for `δ_t = ∂L/∂a_t` (which is `∂L/∂u_t`) and `∂L/∂h0`, and
`∂L/∂Mt = Σ_t H_{t-1}ᵀ·Σ_k δ_t^k` is one product over all `T·B` rows after it.

On a CUDA device the kernels lower through Pallas' Triton backend; anywhere
else they run with `interpret=True` (slow: for tests on tiny shapes).

`u` and `mt` may be bfloat16 (a fused layer under `mixed_bfloat16`): they are
read as bfloat16, half the memory traffic of `u`, and widened to float32 on
chip; the state, the products' accumulation, the activations and the Euler
update run in float32, and `H` is float32. Their gradients come back in their
own dtypes. `h0` and `H` are float32 in every case.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

#: Batch rows per program: the least `M` of a tensor-core product.
BLOCK_BATCH = 16
#: Batches of at most this many rows are one tile of their own size.
SMALL_BATCH = 2
#: Warps per program of whole tiles, by precision: measured on an H100 (B128
#: T784 n128, forward + backward), eight warps halve the full float32 product's
#: time (its 128 x 128 operand spills from four warps' registers) and take a
#: fifth off tf32x3's; four are best for one TF32 product.
WARPS = {"float32": 8, "tf32x3": 8, "tf32": 4}
#: Warps of whole tiles for every precision, where set (None: `WARPS`).
NUM_WARPS = None
#: Warps of the small tile's broadcast product.
SMALL_BATCH_WARPS = 8
#: The least state width of the kernel (smaller widths are zero-padded).
MIN_UNITS = 16
#: `precision` names and the product each step uses.
PRECISIONS = {
    "float32": lax.Precision.HIGHEST,
    "tf32x3": lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
    "tf32": lax.Precision.DEFAULT,
}


def padded_units(units):
    """The kernel's state width: the next power of two, at least `MIN_UNITS`."""
    return max(MIN_UNITS, 1 << (int(units) - 1).bit_length())


def _on_gpu():
    return jax.default_backend() == "gpu"


def _dot(a, b, precision, transpose_b=False):
    """`a·b` (or `a·bᵀ`): a tensor-core product for whole tiles, else multiply and sum.

    Tiles of fewer than `BLOCK_BATCH` rows (a batch of 1 or 2) take the
    broadcast product, exact in float32 and free of the product's least `M`.
    """
    if a.shape[0] < BLOCK_BATCH:
        b = b.T if transpose_b else b
        return jnp.sum(a[:, :, None] * b[None, :, :], axis=1)
    dims = (((1,), (1 if transpose_b else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _blocks_at(ref, t, blocks, n):
    """The `blocks` `n`-wide column blocks of `ref[:, t]`, each `(rows, n)`, as float32."""
    return tuple(ref[:, t, pl.ds(j * n, n)].astype(jnp.float32) for j in range(blocks))


def _forward_kernel(u_ref, mt_ref, h0_ref, h_ref, *slope_refs, eps, gated, precision):
    """One batch tile, all steps; `slope_refs` is empty when no gradient is needed.

    Step `t` loads the inputs of step `t + 1`, whose latency the product hides.
    """
    steps, n = u_ref.shape[1], mt_ref.shape[0]
    blocks = 2 if gated else 1
    mt = mt_ref[...].astype(jnp.float32)

    def step(t, carry):
        h, u_t = carry
        u_next = _blocks_at(u_ref, jnp.minimum(t + 1, steps - 1), blocks, n)
        shared = _dot(h, mt, precision)
        slopes: tuple[Any, ...]
        if gated:
            gate = jax.nn.sigmoid(shared + u_t[0])
            cand = jnp.tanh(shared + u_t[1])
            new = h + eps * gate * cand
            slopes = (eps * cand * gate * (1.0 - gate), eps * gate * (1.0 - cand * cand))
        else:
            cand = jnp.tanh(shared + u_t[0])
            new = h + eps * cand
            slopes = (eps * (1.0 - cand * cand),)
        for j, slope in enumerate(slopes if slope_refs else ()):
            slope_refs[0][:, t, pl.ds(j * n, n)] = slope
        h_ref[:, t, :] = new.astype(h_ref.dtype)
        return new, u_next

    h0 = h0_ref[...].astype(jnp.float32)
    lax.fori_loop(0, steps, step, (h0, _blocks_at(u_ref, 0, blocks, n)))


def _backward_kernel(dh_ref, slope_ref, mt_ref, du_ref, dh0_ref, *, gated, precision):
    """The reverse recurrence of one batch tile: `δ_t` for all steps, then `∂L/∂h0`."""
    steps, n = dh_ref.shape[1], mt_ref.shape[0]
    blocks = 2 if gated else 1
    mt = mt_ref[...].astype(jnp.float32)

    def load(t):
        return dh_ref[:, t, :], _blocks_at(slope_ref, t, blocks, n)

    def step(j, carry):
        g, (dh_t, slopes) = carry
        t = steps - 1 - j
        ahead = load(jnp.maximum(t - 1, 0))
        g = g + dh_t
        delta = jnp.zeros_like(g)
        for k, slope in enumerate(slopes):
            du_ref[:, t, pl.ds(k * n, n)] = g * slope
            delta = delta + g * slope
        return g + _dot(delta, mt, precision, transpose_b=True), ahead

    g0 = jnp.zeros(dh0_ref.shape, jnp.float32)
    dh0_ref[...] = lax.fori_loop(0, steps, step, (g0, load(steps - 1)))[0]


def _tile(shape, rows):
    """The `BlockSpec` of one batch tile of an array whose first axis is the batch."""
    block = (rows, *shape[1:])
    return pl.BlockSpec(block, lambda i: (i,) + (0,) * (len(shape) - 1))


def _whole(shape, rows):
    del rows
    return pl.BlockSpec(tuple(shape), lambda i: (0,) * len(shape))


def padded_batch(batch):
    """The kernel's batch: 1 or 2 as is (one small tile), else whole `BLOCK_BATCH` tiles."""
    if batch <= SMALL_BATCH:
        return batch
    return -(-batch // BLOCK_BATCH) * BLOCK_BATCH


def tile_warps(precision):
    """Warps per program of whole tiles at `precision`."""
    return WARPS[precision] if NUM_WARPS is None else NUM_WARPS


def _call(kernel, ins, in_specs, outs, interpret, precision):
    """`pallas_call` over batch tiles; Triton compiler parameters on a GPU.

    `in_specs` are functions of the tile's rows (`_tile`, `_whole`).
    """
    rows = min(BLOCK_BATCH, ins[0].shape[0])
    params = {}
    if not interpret:
        from jax.experimental.pallas import triton as plgpu

        make = getattr(plgpu, "CompilerParams", None) or plgpu.TritonCompilerParams
        warps = tile_warps(precision) if rows == BLOCK_BATCH else SMALL_BATCH_WARPS
        params["compiler_params"] = make(num_warps=warps, num_stages=1)
    return pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct(s, d) for s, d in outs],
        grid=(ins[0].shape[0] // rows,),
        in_specs=[spec(x.shape, rows) for spec, x in zip(in_specs, ins, strict=True)],
        out_specs=[_tile(s, rows) for s, _ in outs],
        interpret=interpret,
        **params,
    )(*ins)


def _precision(precision, interpret):
    """The products' precision; interpreted (on a CPU), always full float32."""
    return lax.Precision.HIGHEST if interpret else PRECISIONS[precision]


def _forward(u, mt, h0, eps, gated, precision, interpret, with_slopes):
    kernel = functools.partial(
        _forward_kernel, eps=eps, gated=gated, precision=_precision(precision, interpret)
    )
    outs = [((*u.shape[:2], mt.shape[0]), jnp.float32)]
    if with_slopes:
        outs.append((u.shape, jnp.float32))
    specs = [_tile, _whole, _tile]
    return _call(kernel, (u, mt, h0), specs, outs, interpret, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _padded_recurrence(u, mt, h0, eps, gated, precision, interpret):
    return _forward(u, mt, h0, eps, gated, precision, interpret, False)[0]


def _padded_fwd(u, mt, h0, eps, gated, precision, interpret):
    states, slopes = _forward(u, mt, h0, eps, gated, precision, interpret, True)
    return states, (mt, h0, states, slopes, jnp.zeros((0,), u.dtype))


def _padded_bwd(eps, gated, precision, interpret, residuals, d_states):
    mt, h0, states, slopes, u_like = residuals
    kernel = functools.partial(
        _backward_kernel, gated=gated, precision=_precision(precision, interpret)
    )
    specs = [_tile, _tile, _whole]
    outs = [(slopes.shape, jnp.float32), (h0.shape, jnp.float32)]
    d_u, d_h0 = _call(kernel, (d_states, slopes, mt), specs, outs, interpret, precision)
    n = mt.shape[0]
    delta = d_u[..., :n] + d_u[..., n:] if gated else d_u
    previous = jnp.concatenate([h0[:, None].astype(states.dtype), states[:, :-1]], axis=1)
    # ∂L/∂Mt = Σ_{b,t} h_{t-1}ᵀ δ_t: one product over all T·B rows.
    d_mt = jnp.einsum("btn,btm->nm", previous, delta, precision=lax.Precision.HIGHEST).astype(
        mt.dtype
    )
    return d_u.astype(u_like.dtype), d_mt, d_h0.astype(h0.dtype)


_padded_recurrence.defvjp(_padded_fwd, _padded_bwd)


def _pad_blocks(u, blocks, units, width, batch):
    """`u (B, T, k·units)` zero-padded to `(batch, T, k·width)`, block by block."""
    b, steps, _ = u.shape
    u = u.reshape(b, steps, blocks, units)
    u = jnp.pad(u, ((0, batch - b), (0, 0), (0, 0), (0, width - units)))
    return u.reshape(batch, steps, blocks * width)


def recurrence(u, mt, h0, epsilon, gated=False, precision="float32", interpret=None):
    """All states `H (B, T, n)` of the recurrence (see the module docstring).

    Args:
        u: `(B, T, k·n)`, the projected inputs `x_t·V + b` of all steps,
            blocks `[gate z | candidate c]` side by side when `gated`;
            float32 or bfloat16.
        mt: `(n, n)`, the operand that multiplies `h` from the right;
            float32 or bfloat16.
        h0: `(B, n)`, the initial state, float32.
        epsilon: Python float, the Euler step.
        gated: Python bool, whether `u` has a gate block.
        precision: `"float32"` (full float32 products), `"tf32x3"` or `"tf32"`.
        interpret: Python bool or None (None: interpret unless on a GPU).

    Zero padding of the state width to a power of two and of the batch to
    a multiple of `BLOCK_BATCH` (batches over `SMALL_BATCH`) changes no result: padded units stay 0.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    interpret = not _on_gpu() if interpret is None else bool(interpret)
    batch, steps, _ = u.shape
    units, blocks = mt.shape[0], 2 if gated else 1
    width = padded_units(units)
    tiles = padded_batch(batch)
    u_p = _pad_blocks(u, blocks, units, width, tiles)
    mt_p = jnp.pad(mt, ((0, width - units), (0, width - units)))
    h0_p = jnp.pad(h0, ((0, tiles - batch), (0, width - units)))
    states = _padded_recurrence(u_p, mt_p, h0_p, float(epsilon), bool(gated), precision, interpret)
    return states[:batch, :, :units]
