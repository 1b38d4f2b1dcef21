"""The bytes HAProxy's tcp-check sends to ask a verifier's grpc.health.v1 service whether it
serves (deploy/haproxy/haproxy.cfg), and those of the SERVING answer it expects.

    python deploy/haproxy/health_request.py [SERVICE]   # prints the send-binary hex

One HTTP/2 exchange with prior knowledge (h2c): the connection preface, an empty SETTINGS frame,
a HEADERS frame for POST /grpc.health.v1.Health/Check (HPACK without Huffman coding or dynamic
table) and a DATA frame ending the stream with the request message."""

from __future__ import annotations

import sys

SERVICE = "edgekit.verifier.v1.Verifier"
SERVING = bytes.fromhex("00000000020801")  # uncompressed, 2 bytes: field 1 (status) = 1 (SERVING)


def _literal(b: bytes) -> bytes:
    if len(b) >= 127:
        raise ValueError("a header this long needs HPACK's multi-byte length")
    return bytes([len(b)]) + b


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def request(service: str = SERVICE) -> bytes:
    headers = (b"\x83"  # :method POST (static table 3)
               b"\x86"  # :scheme http (6)
               + b"\x04" + _literal(b"/grpc.health.v1.Health/Check")  # :path, literal value
               + b"\x01" + _literal(b"verifier")  # :authority
               + b"\x0f\x10" + _literal(b"application/grpc")  # content-type (31)
               + b"\x00" + _literal(b"te") + _literal(b"trailers"))
    message = b"\x0a" + _literal(service.encode())  # HealthCheckRequest.service
    data = b"\x00" + len(message).to_bytes(4, "big") + message  # gRPC's frame: uncompressed, length
    return (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b"")  # preface, SETTINGS
            + _frame(1, 0x4, 1, headers)  # HEADERS, END_HEADERS
            + _frame(0, 0x1, 1, data))  # DATA, END_STREAM


if __name__ == "__main__":
    print(request(*sys.argv[1:2]).hex())
