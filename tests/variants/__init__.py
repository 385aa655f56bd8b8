"""Differential tests of variants/ against reference/ (Triton and CUDA cases included)."""
