"""Kernels the module runs: band-keep (FFT/DCT), requantisers, page scoring. numpy/scipy/pyfftw only."""
