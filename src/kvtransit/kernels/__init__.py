"""Kernels the module runs: band-keep (FFT/DCT), requantisers, page scoring, and their accuracy.

numpy/scipy/pyfftw/ml_dtypes only (plus kvtransit.model for declarations); no clock, threads or logging.
The middlebox's entry point is `get_codec(name, ...)`; see `registry.py` for the interface and
`header.py` for the self-describing header.
"""

from kvtransit.kernels.errors import KernelInputError
from kvtransit.kernels.registry import CODEC_NAMES, Codec, Encoded, decode, get_codec

__all__ = ["CODEC_NAMES", "Codec", "Encoded", "KernelInputError", "decode", "get_codec"]
