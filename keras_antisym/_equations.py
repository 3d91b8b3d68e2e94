"""The AntisymmetricRNN's equations, written once for the Keras 3 and the tf_keras cells.

    h_t = h_{t-1} + ε·tanh((W − Wᵀ − γI)·h_{t-1} + V·x_t + b)
    z_t = σ((W − Wᵀ − γI)·h_{t-1} + V_z·x_t + b_z)
    h_t = h_{t-1} + ε·z_t ⊙ tanh((W − Wᵀ − γI)·h_{t-1} + V_h·x_t + b_h)        (gated)

`keras_antisym.cells` (Keras 3) and `keras_antisym.legacy` (tf_keras) both compute
through these functions, so the weight layout, the initialization of `W` and the
step cannot drift apart. Array functions come in as `ops`, a namespace with the
names and signatures of `keras.ops` for `matmul`, `transpose`, `eye`, `zeros`,
`scatter_update`, `reshape` and `take`: `keras.ops` itself for Keras 3,
`keras_antisym.legacy.TF_OPS` (TensorFlow ops) for tf_keras. Activations are
callables; everything else is `+`, `-` and `*`. This module imports neither
Keras nor TensorFlow.

Row-major convention, as in Keras: a batch of states `h` `(batch, units)` is
multiplied from the right by the operand `(W − Wᵀ − γI)ᵀ`.
"""

import math

import numpy as np


def upper_triangle_indices(units):
    """`(units·(units-1)/2, 2)` positions of the strictly upper triangle.

    The stored vector `w` of `W` follows this row-major order, the order of
    `numpy.triu_indices(units, 1)`.
    """
    return np.stack(np.triu_indices(units, 1), axis=-1).astype("int32")


def recurrent_kernel_shape(units, antisymmetric):
    """Shape of the stored `recurrent_kernel`: `(n(n-1)/2,)`, or `(n, n)` for the ablation."""
    return (units * (units - 1) // 2,) if antisymmetric else (units, units)


def add_weights(cell, input_shape, rnn):
    """Creates a cell's `kernel`, `recurrent_kernel` and `bias` with `cell.add_weight`.

    The weight layout of both cells (Keras 3 and tf_keras): `kernel`
    `(features, blocks·units)`, `recurrent_kernel` of `recurrent_kernel_shape`,
    initialized through `cell._upper_triangle_initializer` (the strict upper
    triangle of the recurrent initializer's square draw) unless it is the
    ablation, and `bias` `(blocks·units,)` or None. `rnn` names the RNN layer
    in the error for an unusable step shape.
    """
    if len(input_shape) != 2 or input_shape[-1] is None:
        raise ValueError(
            f"{cell.__class__.__name__} expects step inputs of shape "
            "(batch, features) with a known number of features, that is "
            "sequences of shape (batch, timesteps, features) given to "
            f"{rnn}; got a step input shape of {input_shape}."
        )
    blocks = cell.num_blocks * cell.units
    cell.kernel = cell.add_weight(
        shape=(input_shape[-1], blocks),
        name="kernel",
        initializer=cell.kernel_initializer,
        regularizer=cell.kernel_regularizer,
        constraint=cell.kernel_constraint,
    )
    cell.recurrent_kernel = cell.add_weight(
        shape=recurrent_kernel_shape(cell.units, cell.antisymmetric),
        name="recurrent_kernel",
        initializer=(
            cell._upper_triangle_initializer if cell.antisymmetric else cell.recurrent_initializer
        ),
        regularizer=cell.recurrent_regularizer,
        constraint=cell.recurrent_constraint,
    )
    cell.bias = None
    if cell.use_bias:
        cell.bias = cell.add_weight(
            shape=(blocks,),
            name="bias",
            initializer=cell.bias_initializer,
            regularizer=cell.bias_regularizer,
            constraint=cell.bias_constraint,
        )


def upper_triangle(ops, full, units):
    """The stored vector `w`: the strictly upper triangle of `full` `(units, units)`.

    How `recurrent_initializer`'s `(units, units)` draw becomes `recurrent_kernel`.
    """
    indices = upper_triangle_indices(units)
    return ops.take(ops.reshape(full, (-1,)), indices[:, 0] * units + indices[:, 1])


def recurrent_operand(ops, stored, units, gamma, antisymmetric, indices=None):
    """`(W − Wᵀ − γI)ᵀ` from the stored `recurrent_kernel` (`(U − γI)ᵀ` for the ablation).

    Args:
        ops: The array namespace (see the module doc).
        stored: The `recurrent_kernel` tensor.
        units: The state size `n`.
        gamma: The diffusion `γ`.
        antisymmetric: Boolean, whether `stored` is the upper triangle of `W`.
        indices: `upper_triangle_indices(units)`, when the caller keeps them.
    """
    eye = ops.eye(units, dtype=stored.dtype)
    if not antisymmetric:
        return ops.transpose(stored) - gamma * eye
    if indices is None:
        indices = upper_triangle_indices(units)
    # A scatter (whose gradient is a dense gather), not a gather: the gradient
    # of `w` stays a dense vector for the optimizers. Not `ops.scatter`: on
    # PyTorch it loops over the n(n-1)/2 indices in Python.
    zeros = ops.zeros((units, units), dtype=stored.dtype)
    upper = ops.scatter_update(zeros, indices, stored)
    return ops.transpose(upper) - upper - gamma * eye


def input_blocks(kernel, bias, units, num_blocks):
    """`[(V_k, b_k)]`: `kernel` `(m, num_blocks·units)` and `bias` as `units`-wide blocks.

    One block ungated; `[gate z, candidate h]` gated (`b_k` is None without bias).
    """
    if num_blocks == 1:
        return [(kernel, bias)]
    return [
        (
            kernel[:, k * units : (k + 1) * units],
            None if bias is None else bias[k * units : (k + 1) * units],
        )
        for k in range(num_blocks)
    ]


def project_blocks(ops, inputs, weights):
    """`[x·V_kᵀ + b_k]` per block, for `weights` from `input_blocks`."""
    return [
        ops.matmul(inputs, kernel) if bias is None else ops.matmul(inputs, kernel) + bias
        for kernel, bias in weights
    ]


def recurrent_term(ops, h, operand, recurrent_mask=None):
    """`(W − Wᵀ − γI)·h_{t-1}`, row-major; recurrent dropout drops `h_{t-1}` here only."""
    return ops.matmul(h if recurrent_mask is None else h * recurrent_mask, operand)


def vector_field(shared, blocks, activation, recurrent_activation=None, derivative=None):
    """The right-hand side `f` of the ODE `h' = f(h, x)`, and optionally `d = ∂f/∂(M h)`.

    Ungated (one block): `f = act(a)`, `d = act'(a)`. Gated (blocks `[gate, candidate]`):
    `f = z ⊙ c` with `z = recurrent_activation(a_z)`, `c = act(a_c)`, and
    `d = c ⊙ recurrent_activation'(a_z) + z ⊙ act'(a_c)`; `a_k = M h + V_k x + b_k`.

    Args:
        shared: The recurrent term `M h` (`recurrent_term`), `(batch, units)`.
        blocks: The projected input blocks `[x·V_kᵀ + b_k]`.
        activation: The activation of the update.
        recurrent_activation: The gate's activation; None for the ungated cell.
        derivative: None, or `derivative(activation, x)` giving `activation'(x)`:
            then `(f, d)` is returned.

    Returns:
        `f`, or `(f, d)`.
    """
    if recurrent_activation is None:
        (projected,) = blocks
        pre_activation = shared + projected
        rate = activation(pre_activation)
        if derivative is None:
            return rate
        return rate, derivative(activation, pre_activation)
    projected_gate, projected_candidate = blocks
    gate_input = shared + projected_gate
    candidate_input = shared + projected_candidate
    gate = recurrent_activation(gate_input)
    candidate = activation(candidate_input)
    rate = gate * candidate
    if derivative is None:
        return rate
    slope = candidate * derivative(recurrent_activation, gate_input) + gate * derivative(
        activation, candidate_input
    )
    return rate, slope


def euler_step(h, epsilon, rate):
    """The forward-Euler step `h_t = h_{t-1} + ε·f`."""
    return h + epsilon * rate


def fan_in_stddev(sigma, shape):
    """The paper's `N(0, σ²/fan_in)` standard deviation, `fan_in = shape[0]`."""
    return sigma / math.sqrt(max(1, shape[0]))
