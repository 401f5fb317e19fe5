"""Fixtures of these tests: compiled kernels go to a private on-disk cache per module."""

from private_cache import private_cache

__all__ = ["private_cache"]
