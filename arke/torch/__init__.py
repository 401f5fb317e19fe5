"""Arke inside PyTorch: kernels as ``torch.ops`` (:func:`register`) and ``torch.compile(backend="arke")``
(:mod:`arke.torch.backend`)."""

from arke.torch.ops import Ops, register, result_meta


def repack() -> None:
    """Forget the weights ``torch.compile(backend="arke")`` packed (:func:`arke.torch.fx_ops.repack`): needed only
    after a write through ``w.data`` in place, which torch's version counter does not see."""
    from arke.torch.fx_ops import repack as forget

    forget()


__all__ = ["Ops", "register", "repack", "result_meta"]
