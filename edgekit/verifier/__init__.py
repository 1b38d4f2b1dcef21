"""The reference verifier: the target model on llama.cpp behind edgekit.verifier.v1."""

from ._server import VerifierServer

__all__ = ["VerifierServer"]
