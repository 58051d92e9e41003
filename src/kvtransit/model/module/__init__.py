"""The compute-in-transit module: what a kernel declares, what the module affords, and which codec runs a declaration
(pure)."""
