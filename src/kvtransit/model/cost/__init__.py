"""What things cost: the GPU roofline, energy, a hand-off's time, the codec on a GPU (pure)."""
