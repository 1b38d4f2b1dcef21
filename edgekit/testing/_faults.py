"""A `ScriptedTransport` handler from a script of faults: `faults`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeAlias

from ..errors import VerifierUnavailableError
from ._scripted import METHODS, Call

Fault: TypeAlias = Literal["drop", "lose"] | BaseException | Callable[[Call], Any]
"""What a script does at a call: see `faults`."""


def faults(script: Mapping[str, Mapping[int, Fault]], otherwise: Callable[[Call], Any] | None = None,
           ) -> Callable[[Call], Any]:
    """A handler that answers the n-th call of a method by `script[method][n]`:

    - "drop": the request never arrives (`VerifierUnavailableError`, nothing applied);
    - "lose": forwarded and applied, its answer lost (`VerifierUnavailableError`; a stream runs
      to its end first);
    - an exception: raised instead of the call;
    - a function of the `Call`: its return is the answer (it may raise);

    and every other call by `otherwise(call)` (default: forwarded to the inner transport)."""
    for method, at in script.items():
        if method not in METHODS:
            raise ValueError(f"no transport call {method!r} to script; there are {', '.join(METHODS)}")
        for n, fault in at.items():
            if isinstance(fault, str) and fault not in ("drop", "lose"):
                raise ValueError(f"{method} call {n}: {fault!r} is no fault (\"drop\", \"lose\")")
    rest = otherwise or Call.forward

    def handler(call: Call) -> Any:
        fault = script.get(call.method, {}).get(call.n)
        address = call.transport.address
        if fault is None:
            return rest(call)
        if fault == "drop":
            raise VerifierUnavailableError(f"{call} to {address} dropped (scripted)", address=address)
        if fault == "lose":
            answer = call.forward()
            if isinstance(answer, Iterator):
                deque(answer, maxlen=0)
            raise VerifierUnavailableError(f"the answer to {call} from {address} was lost (scripted)", address=address)
        if isinstance(fault, BaseException):
            raise fault
        return fault(call)

    return handler
