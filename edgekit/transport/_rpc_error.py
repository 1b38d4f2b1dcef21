"""`map_rpc_error`: a gRPC failure as the edgekit error that says what to do."""

from __future__ import annotations

from typing import Any

import grpc

from ..errors import EdgekitError
from ..protocol import error_from_status

__all__ = ["map_rpc_error"]


def map_rpc_error(exc: grpc.RpcError, address: str, *, during: str, deadline: float | None = None) -> EdgekitError:
    """Turns a gRPC failure into the edgekit error that says what to do."""
    call: Any = exc  # an RpcError raised by a call is also a grpc.Call
    code = call.code() if hasattr(call, "code") else grpc.StatusCode.UNKNOWN
    detail = (call.details() if hasattr(call, "details") else None) or str(exc)
    trailers = call.trailing_metadata() if hasattr(call, "trailing_metadata") else None
    return error_from_status(code, detail, trailers or (), address=address, during=during, deadline=deadline)
