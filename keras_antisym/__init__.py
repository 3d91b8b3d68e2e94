"""keras-antisym: the AntisymmetricRNN (Chang et al., ICLR 2019) for Keras 3."""

from keras_antisym.cells import AntisymmetricCell, GatedAntisymmetricCell
from keras_antisym.diagnostics import StabilityDiagnostics
from keras_antisym.initializers import FanInNormal
from keras_antisym.layers import AntisymmetricRNN, GatedAntisymmetricRNN
from keras_antisym.stability import (
    eigenvalue_magnitude_stats,
    end_to_end_jacobian,
    end_to_end_jacobian_stats,
    ode_jacobian,
    stability_margin,
    step_jacobian,
    transition_eigenvalues,
    transition_matrix,
)

__version__ = "0.1.0"

__all__ = [
    "AntisymmetricCell",
    "AntisymmetricRNN",
    "FanInNormal",
    "GatedAntisymmetricCell",
    "GatedAntisymmetricRNN",
    "StabilityDiagnostics",
    "__version__",
    "eigenvalue_magnitude_stats",
    "end_to_end_jacobian",
    "end_to_end_jacobian_stats",
    "ode_jacobian",
    "stability_margin",
    "step_jacobian",
    "transition_eigenvalues",
    "transition_matrix",
]
