"""Model families: one module per family (its config mapping and its deviations from the shared
trunk) and the registry that finds a family by `model_type` or GGUF architecture.

Invariant: no family imports another; everything two families share lives in exactdraft.models.
"""
