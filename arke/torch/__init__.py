"""Arke inside PyTorch: kernels as ``torch.ops`` (:func:`register`) and ``torch.compile(backend="arke")``
(:mod:`arke.torch.backend`)."""

from arke.torch.ops import Ops, register, result_meta

__all__ = ["Ops", "register", "result_meta"]
