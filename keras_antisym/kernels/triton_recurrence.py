"""The AntisymmetricRNN recurrence as one Triton kernel (PyTorch), forward and backward.

The same algorithm, shapes and padding as `pallas_recurrence` (see there):
one program owns `BLOCK_BATCH` batch rows, loads `Mt` once and runs all `T`
steps; the forward also stores the slopes `ε·∂rate/∂a_t` when a gradient is
needed, and the backward kernel runs the reverse recurrence for `δ_t` and
`∂L/∂h0`, with `∂L/∂Mt` one product over all `T·B` rows after it
(`torch.autograd.Function`).

Runs on CUDA tensors, or on CPU tensors under Triton's interpreter
(`TRITON_INTERPRET=1` set before `triton` is first imported).
"""

import os

import torch
import triton
import triton.language as tl

#: Batch rows per program: the least `M` of `tl.dot`.
BLOCK_BATCH = 16
#: The least state width of the kernel (smaller widths are zero-padded).
MIN_UNITS = 16
#: `precision` names and Triton's `input_precision` of each step's product.
PRECISIONS = {"float32": "ieee", "tf32x3": "tf32x3", "tf32": "tf32"}
#: Batches of at most this many rows are one tile of their own size.
SMALL_BATCH = 2
#: Warps per program of whole tiles, by precision: measured on an H100 (B128
#: T784 n128, forward + backward), eight warps take a quarter off tf32x3's
#: time; four are best for the full float32 product and for one TF32 product.
WARPS = {"float32": 4, "tf32x3": 8, "tf32": 4}
#: Warps of whole tiles for every precision, where set (None: `WARPS`).
NUM_WARPS = None
#: Warps of the small tile's broadcast product.
SMALL_BATCH_WARPS = 8


def padded_units(units):
    """The kernel's state width: the next power of two, at least `MIN_UNITS`."""
    return max(MIN_UNITS, 1 << (int(units) - 1).bit_length())


def interpreted():
    """Whether Triton runs its interpreter (on CPU tensors) instead of compiling."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _product(a, b, PRECISION: tl.constexpr, BB: tl.constexpr):
    """`a·b`: `tl.dot` for whole tiles, multiply and sum for a tile of 1 or 2 rows."""
    if BB >= 16:
        return tl.dot(a, b, input_precision=PRECISION)
    return tl.sum(a[:, :, None] * b[None, :, :], axis=1)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _forward_kernel(
    u_ptr,
    mt_ptr,
    h0_ptr,
    h_ptr,
    s_ptr,
    steps,
    eps,
    N: tl.constexpr,
    BB: tl.constexpr,
    GATED: tl.constexpr,
    SLOPES: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One batch tile, all steps. `u`/`s` are `(B, T, k·N)`, `h` `(B, T, N)`, contiguous.

    Step `t` loads the inputs of step `t + 1`, whose latency the product hides.
    """
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    cols = tl.arange(0, N)
    width = 2 * N if GATED else N
    mt = tl.load(mt_ptr + cols[:, None] * N + cols[None, :]).to(tl.float32)
    h = tl.load(h0_ptr + rows[:, None] * N + cols[None, :]).to(tl.float32)
    u_row = rows[:, None] * (steps * width) + cols[None, :]
    h_row = rows[:, None] * (steps * N) + cols[None, :]
    u_a = tl.load(u_ptr + u_row).to(tl.float32)
    u_c = tl.load(u_ptr + u_row + N).to(tl.float32) if GATED else u_a
    for t in range(steps):
        ahead = u_row + tl.minimum(t + 1, steps - 1) * width
        next_a = tl.load(u_ptr + ahead).to(tl.float32)
        next_c = tl.load(u_ptr + ahead + N).to(tl.float32) if GATED else next_a
        shared = _product(h, mt, PRECISION, BB)
        at = u_row + t * width
        if GATED:
            gate = tl.sigmoid(shared + u_a)
            cand = _tanh(shared + u_c)
            h = h + eps * gate * cand
            if SLOPES:
                tl.store(s_ptr + at, eps * cand * gate * (1.0 - gate))
                tl.store(s_ptr + at + N, eps * gate * (1.0 - cand * cand))
        else:
            cand = _tanh(shared + u_a)
            h = h + eps * cand
            if SLOPES:
                tl.store(s_ptr + at, eps * (1.0 - cand * cand))
        tl.store(h_ptr + h_row + t * N, h)
        u_a, u_c = next_a, next_c


@triton.jit
def _backward_kernel(
    dh_ptr,
    s_ptr,
    mt_ptr,
    du_ptr,
    dh0_ptr,
    steps,
    N: tl.constexpr,
    BB: tl.constexpr,
    GATED: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """The reverse recurrence of one tile: `du = δ` for all steps, then `dh0`."""
    rows = tl.program_id(0) * BB + tl.arange(0, BB)
    cols = tl.arange(0, N)
    width = 2 * N if GATED else N
    mt_t = tl.load(mt_ptr + cols[None, :] * N + cols[:, None]).to(tl.float32)  # Mtᵀ
    g = tl.zeros((BB, N), dtype=tl.float32)
    u_row = rows[:, None] * (steps * width) + cols[None, :]
    h_row = rows[:, None] * (steps * N) + cols[None, :]
    last = steps - 1
    dh_t = tl.load(dh_ptr + h_row + last * N)
    s_a = tl.load(s_ptr + u_row + last * width)
    s_c = tl.load(s_ptr + u_row + last * width + N) if GATED else s_a
    for j in range(steps):
        t = last - j
        ahead = tl.maximum(t - 1, 0)
        next_dh = tl.load(dh_ptr + h_row + ahead * N)
        next_a = tl.load(s_ptr + u_row + ahead * width)
        next_c = tl.load(s_ptr + u_row + ahead * width + N) if GATED else next_a
        g = g + dh_t
        at = u_row + t * width
        delta = g * s_a
        tl.store(du_ptr + at, delta)
        if GATED:
            tl.store(du_ptr + at + N, g * s_c)
            delta = delta + g * s_c
        g = g + _product(delta, mt_t, PRECISION, BB)
        dh_t, s_a, s_c = next_dh, next_a, next_c
    tl.store(dh0_ptr + rows[:, None] * N + cols[None, :], g)


def tile_warps(precision):
    """Warps per program of whole tiles at `precision`."""
    return WARPS[precision] if NUM_WARPS is None else NUM_WARPS


def _tiles(batch, precision="float32"):
    """`(padded batch, rows per program, warps)`: 1 or 2 rows as is, else whole tiles."""
    if batch <= SMALL_BATCH:
        return batch, batch, SMALL_BATCH_WARPS
    return -(-batch // BLOCK_BATCH) * BLOCK_BATCH, BLOCK_BATCH, tile_warps(precision)


def _forward(u, mt, h0, eps, gated, precision, with_slopes):
    batch, steps, _ = u.shape
    n = mt.shape[0]
    states = torch.empty((batch, steps, n), dtype=torch.float32, device=u.device)
    slopes = (
        torch.empty(u.shape, dtype=torch.float32, device=u.device) if with_slopes else states
    )  # unused when no slopes
    _, rows, warps = _tiles(batch, precision)
    _forward_kernel[(batch // rows,)](
        u,
        mt,
        h0,
        states,
        slopes,
        steps,
        eps,
        N=n,
        BB=rows,
        GATED=gated,
        SLOPES=with_slopes,
        PRECISION=PRECISIONS[precision],
        num_warps=warps,
    )
    return states, (slopes if with_slopes else None)


def _backward(d_states, slopes, mt, gated, precision):
    batch, steps, n = d_states.shape
    d_u = torch.empty_like(slopes)
    d_h0 = torch.empty((batch, n), dtype=torch.float32, device=d_states.device)
    _, rows, warps = _tiles(batch, precision)
    _backward_kernel[(batch // rows,)](
        d_states,
        slopes,
        mt,
        d_u,
        d_h0,
        steps,
        N=n,
        BB=rows,
        GATED=gated,
        PRECISION=PRECISIONS[precision],
        num_warps=warps,
    )
    return d_u, d_h0


class _Recurrence(torch.autograd.Function):
    """`H = recurrence(u, mt, h0)` on padded, contiguous tensors (`u`, `mt` float32 or bfloat16)."""

    @staticmethod
    def forward(ctx, u, mt, h0, eps, gated, precision):
        states, slopes = _forward(u, mt, h0, eps, gated, precision, True)
        ctx.save_for_backward(mt, h0, states, slopes)
        ctx.gated, ctx.precision, ctx.u_dtype = gated, precision, u.dtype
        return states

    @staticmethod
    def backward(ctx, d_states):
        mt, h0, states, slopes = ctx.saved_tensors
        d_u, d_h0 = _backward(d_states.contiguous(), slopes, mt, ctx.gated, ctx.precision)
        n = mt.shape[0]
        delta = d_u[..., :n] + d_u[..., n:] if ctx.gated else d_u
        previous = torch.cat([h0[:, None], states[:, :-1]], dim=1)
        # ∂L/∂Mt = Σ_{b,t} h_{t-1}ᵀ δ_t: one product over all T·B rows.
        d_mt = previous.reshape(-1, n).transpose(0, 1) @ delta.reshape(-1, n)
        return d_u.to(ctx.u_dtype), d_mt.to(mt.dtype), d_h0, None, None, None


def _pad(u, mt, h0, gated):
    """Zero padding to a power-of-two width and whole batch tiles (changes no result).

    `h0` is always copied: a stateful layer assigns its last state into the
    tensor it started from, which the backward must not see change.
    """
    batch, steps, _ = u.shape
    units, blocks = mt.shape[0], 2 if gated else 1
    width = padded_units(units)
    tiles, _, _ = _tiles(batch)
    pad_n, pad_b = width - units, tiles - batch
    pad = torch.nn.functional.pad
    if pad_n:
        u = pad(u.reshape(batch, steps, blocks, units), (0, pad_n))
        u = u.reshape(batch, steps, blocks * width)
        mt = pad(mt, (0, pad_n, 0, pad_n))
    if pad_b:
        u = pad(u, (0, 0, 0, 0, 0, pad_b))
    h0 = pad(h0, (0, pad_n, 0, pad_b)) if pad_n or pad_b else h0.clone()
    return u.contiguous(), mt.contiguous(), h0


def recurrence(u, mt, h0, epsilon, gated=False, precision="float32"):
    """All states `H (B, T, n)`; see `pallas_recurrence.recurrence` for the arguments.

    Tensors on a CUDA device, or on the CPU under `TRITON_INTERPRET=1`: `u`
    and `mt` float32 or bfloat16 (read as stored, widened to float32 on
    chip), `h0` float32; the state, the accumulation and `H` are float32.
    Differentiable (`torch.autograd`); without a gradient to record, the
    forward kernel stores no slopes.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    if u.device.type != "cuda" and not interpreted():
        raise RuntimeError(
            "The Triton recurrence kernel runs on CUDA tensors, or on the CPU "
            "under Triton's interpreter (TRITON_INTERPRET=1 before importing triton)."
        )
    batch, _, _ = u.shape
    units = mt.shape[0]
    u_p, mt_p, h0_p = _pad(u, mt, h0, gated)
    eps = float(epsilon)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (u, mt, h0)):
        states = _Recurrence.apply(u_p, mt_p, h0_p, eps, bool(gated), precision)
    else:
        states, _ = _forward(u_p, mt_p, h0_p, eps, bool(gated), precision, False)
    return states[:batch, :, :units]
