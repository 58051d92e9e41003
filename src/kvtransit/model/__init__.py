"""The model library: catalogues, roofline cost model, energy, workloads, the module budget. Pure."""
