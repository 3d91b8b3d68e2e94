"""keras-antisym: the AntisymmetricRNN (Chang et al., ICLR 2019) for Keras 3."""

from keras_antisym.cells import AntisymmetricCell, GatedAntisymmetricCell
from keras_antisym.initializers import FanInNormal
from keras_antisym.layers import AntisymmetricRNN, GatedAntisymmetricRNN

__version__ = "0.1.0"

__all__ = [
    "AntisymmetricCell",
    "AntisymmetricRNN",
    "FanInNormal",
    "GatedAntisymmetricCell",
    "GatedAntisymmetricRNN",
    "__version__",
]
