"""Independent NumPy implementation of the paper's equations, step by step (float64).

The reference the test suite and `benchmarks.gpu_kernel_check` hold the layers to.

Column-vector convention of the paper (`M h`), one sample at a time, float64:
nothing here is shared with the library's row-major batched code.
"""

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def transition_matrix(recurrent_kernel, units, gamma, antisymmetric=True):
    """`W - Wᵀ - γI` from the stored strictly upper triangle (or `U - γI`)."""
    if antisymmetric:
        w = np.zeros((units, units))
        k = 0
        for i in range(units):
            for j in range(i + 1, units):
                w[i, j] = recurrent_kernel[k]
                k += 1
        return w - w.T - gamma * np.eye(units)
    return np.asarray(recurrent_kernel, dtype="float64") - gamma * np.eye(units)


def run(
    weights,
    x,
    *,
    units,
    epsilon,
    gamma,
    gated=False,
    antisymmetric=True,
    mask=None,
    go_backwards=False,
    zero_output_for_mask=False,
    h0=None,
):
    """Runs the RNN over `x` `(batch, T, m)`.

    Returns `(outputs (batch, T, units) in processing order, last_state)`.
    A masked step keeps the state; its output is the state (or zeros).
    """
    kernel, recurrent_kernel = weights[0], weights[1]
    bias = weights[2] if len(weights) > 2 else np.zeros(kernel.shape[1])
    m_matrix = transition_matrix(recurrent_kernel, units, gamma, antisymmetric)
    v = np.asarray(kernel, "float64").T  # (blocks*units, m)
    batch, steps, _ = x.shape
    outputs = np.zeros((batch, steps, units))
    states = np.zeros((batch, units))
    order = range(steps - 1, -1, -1) if go_backwards else range(steps)
    for b in range(batch):
        h = np.zeros(units) if h0 is None else np.asarray(h0[b], "float64")
        for position, t in enumerate(order):
            if mask is not None and not mask[b, t]:
                outputs[b, position] = 0.0 if zero_output_for_mask else h
                continue
            pre = v @ x[b, t] + bias
            shared = m_matrix @ h
            if gated:
                z = sigmoid(shared + pre[:units])
                h = h + epsilon * z * np.tanh(shared + pre[units:])
            else:
                h = h + epsilon * np.tanh(shared + pre)
            outputs[b, position] = h
        states[b] = h
    return outputs, states
