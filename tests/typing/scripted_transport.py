"""Checked by mypy (`make typecheck`), never run: a `ScriptedTransport` is a `VerifierTransport`,
so a test may hand it wherever a transport goes."""

from edgekit.testing import ScriptedTransport, ToyLanguageModel, toy_verifier
from edgekit.transport import VerifierTransport

scripted: VerifierTransport = ScriptedTransport(toy_verifier(ToyLanguageModel()), script={"verify": {3: "lose"}})
