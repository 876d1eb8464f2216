"""STRUCTURED_DERIVATIVES: NTKs from the structure of each primitive's derivative."""
