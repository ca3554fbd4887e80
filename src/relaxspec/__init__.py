"""relaxspec: speculative decoding with relaxed verification (NSD, verifier skipping, ProVe)."""

from relaxspec.errors import RelaxSpecError

__version__ = "0.1.0"
__all__ = ["RelaxSpecError", "__version__"]
