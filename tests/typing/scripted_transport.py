"""Checked by mypy (`make typecheck`), never run: a `ScriptedTransport` is a `VerifierTransport`,
so a test may hand it wherever a transport goes."""

from edgekit.testing import ScriptedTransport, ToyLanguageModel, faults, toy_verifier
from edgekit.transport import VerifierTransport

lossy = faults({"verify": {3: "lose"}})
scripted: VerifierTransport = ScriptedTransport(toy_verifier(ToyLanguageModel()), handler=lossy)
