"""Attention backends behind one registry; importing this package registers all of them."""

from . import fa4, flashinfer, flex, reference, torch_blocks, triton_kernel, triton_tma  # noqa: F401
from .registry import available_backends, register_backend

__all__ = ["available_backends", "register_backend"]
