"""What one round's call costs gRPC Python's server: unary calls against a stream per device.

The verifier answers each round as a unary call on gRPC Python's synchronous server, and at zero
model cost that call, not the verifier's own work, sets its pace (benchmarks/serve_load.py). This
isolates the transport: a server that echoes a verdict-sized message, pinned to one core, driven
by asyncio devices on the other cores, each sending its next message once the last is answered;
for each server (the synchronous one with a thread per call in flight, as the verifier's, and
grpc.aio's) and each way of calling (a unary call per round; one bidirectional stream per device
carrying every round), the messages per second and the server's CPU per message.

    python -m benchmarks grpc_call_cost                            # 64 and 256 devices, 8 s each
    python -m benchmarks grpc_call_cost --devices 128 --duration 5 --server-cores 0-3 --client-cores 4-15
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from concurrent import futures
from pathlib import Path
from typing import Any

from benchmarks import harness as C
from benchmarks.rigs.loadgen import LineProcess, _read_line, _write_line, cpu_seconds, parse_cores, prepare_process

SERVICE = "edgekit.bench.Echo"
REQUEST = bytes(48)  # about a greedy round's VerifyRequest: a session id, a base, 4 tokens, timings
REPLY = bytes(40)  # about its VerifyResponse
_SERVER_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.server.max_pending_requests", 1 << 14),
                   ("grpc.server.max_pending_requests_hard_limit", 1 << 15)]


def _ident(b: bytes) -> bytes:
    return b


def _sync_server(devices: int) -> Any:
    import grpc

    def unary(request: bytes, context: Any) -> bytes:
        return REPLY

    def stream(requests: Any, context: Any) -> Any:
        for _ in requests:
            yield REPLY

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=devices + 8), options=_SERVER_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, _ident, _ident),
        "Stream": grpc.stream_stream_rpc_method_handler(stream, _ident, _ident),
    }),))
    return server


def _aio_server() -> Any:
    import grpc

    async def unary(request: bytes, context: Any) -> bytes:
        return REPLY

    async def stream(requests: Any, context: Any) -> Any:
        async for _ in requests:
            yield REPLY

    server = grpc.aio.server(options=_SERVER_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, _ident, _ident),
        "Stream": grpc.stream_stream_rpc_method_handler(stream, _ident, _ident),
    }),))
    return server


def server_main() -> None:
    """The echo server: its spec on stdin, "ready" with its address, then "stats" until "quit"."""
    spec = _read_line()
    prepare_process(spec["cores"])
    if spec["server"] == "sync":
        server = _sync_server(spec["devices"])
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        _serve(port)
        server.stop(0.5).wait()
        return

    async def run() -> None:
        server = _aio_server()
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await asyncio.get_running_loop().run_in_executor(None, _serve, port)
        await server.stop(0.5)

    asyncio.run(run())


def _serve(port: int) -> None:
    _write_line({"ready": True, "address": f"127.0.0.1:{port}", "pid": os.getpid()})
    for line in sys.stdin:
        if "quit" in line:
            return


def client_main() -> None:
    """Devices of one client process: the spec, "ready", the window, then its message count."""
    spec = _read_line()
    prepare_process(spec["cores"])
    _write_line({"ready": True})
    window = _read_line()
    counts = asyncio.run(_drive(spec, window["start"], window["end"]))
    _write_line({"messages": counts[0], "errors": counts[1]})


async def _drive(spec: dict[str, Any], start: float, end: float) -> tuple[int, int]:
    import grpc

    channels = [grpc.aio.insecure_channel(spec["address"]) for _ in range(spec["devices"])]
    counted = [0, 0]

    async def unary(channel: Any) -> None:
        call = channel.unary_unary(f"/{SERVICE}/Unary", request_serializer=_ident, response_deserializer=_ident)
        while time.monotonic() < end:
            try:
                await call(REQUEST, timeout=60)
            except grpc.RpcError:
                counted[1] += 1
                continue
            counted[0] += start <= time.monotonic() <= end

    async def stream(channel: Any) -> None:
        call = channel.stream_stream(f"/{SERVICE}/Stream", request_serializer=_ident, response_deserializer=_ident)
        try:
            rpc = call(timeout=600)
            while time.monotonic() < end:
                await rpc.write(REQUEST)
                await rpc.read()
                counted[0] += start <= time.monotonic() <= end
            await rpc.done_writing()
            while await rpc.read() is not grpc.aio.EOF:  # the server ends its side
                pass
        except grpc.RpcError:
            counted[1] += 1

    drive = unary if spec["way"] == "unary" else stream
    await asyncio.gather(*(drive(c) for c in channels))
    for c in channels:
        await c.close()
    return counted[0], counted[1]


def run_point(server_kind: str, way: str, devices: int, args: argparse.Namespace) -> dict[str, Any]:
    me = "benchmarks.grpc_call_cost"
    server = LineProcess(C.module_command(me, "server"), cores=args.server_cores)
    server.send({"server": server_kind, "devices": devices, "cores": args.server_cores})
    ready = server.recv()
    n = len(args.client_cores)
    clients = [LineProcess(C.module_command(me, "client"), cores=[core]) for core in args.client_cores]
    for i, c in enumerate(clients):
        c.send({"address": ready["address"], "devices": len(range(i, devices, n)), "way": way,
                "cores": [args.client_cores[i]]})
    for c in clients:
        c.recv()
    start = time.monotonic() + args.warmup
    end = start + args.duration
    for c in clients:
        c.send({"start": start, "end": end})
    time.sleep(max(0.0, start - time.monotonic()))
    cpu0, clients0 = cpu_seconds(ready["pid"]), [cpu_seconds(c.proc.pid) for c in clients]
    time.sleep(max(0.0, end - time.monotonic()))
    cpu1, clients1 = cpu_seconds(ready["pid"]), [cpu_seconds(c.proc.pid) for c in clients]
    results = [c.recv() for c in clients]
    for c in clients:
        c.wait()
    server.send({"command": "quit"})
    server.wait()
    messages = sum(r["messages"] for r in results)
    return {
        "server": server_kind, "way": way, "devices": devices,
        "messages_per_s": messages / args.duration,
        "server_cpu_share": (cpu1 - cpu0) / args.duration / len(args.server_cores),
        "server_cpu_us_per_message": (cpu1 - cpu0) / max(messages, 1) * 1e6,
        "client_cpu_share": max(b - a for a, b in zip(clients0, clients1)) / args.duration,
        "errors": sum(r["errors"] for r in results),
    }


def plot(result: dict[str, Any], png: Path) -> None:
    fig, (ax, bx) = C.subplots(2, width=5.5)
    for key in sorted({(p["server"], p["way"]) for p in result["points"]}):
        pts = [p for p in result["points"] if (p["server"], p["way"]) == key]
        xs = [p["devices"] for p in pts]
        ax.plot(xs, [p["messages_per_s"] for p in pts], "o-", label=f"{key[0]} server, {key[1]}")
        bx.plot(xs, [p["server_cpu_us_per_message"] for p in pts], "o-", label=f"{key[0]} server, {key[1]}")
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlabel("devices, a message in flight each")
    ax.set_ylabel("messages per second (server on one core)")
    bx.set_ylabel("server CPU per message (us)")
    ax.set_title("gRPC Python: a unary call per round, or a stream per device")
    C.save_figure(fig, png)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("server", "client"):
        (server_main if sys.argv[1] == "server" else client_main)()
        return
    ap = C.arguments(__doc__, replot=True, threads=None, out="grpc_call_cost")
    ap.add_argument("--devices", default="64,256")
    ap.add_argument("--servers", default="sync,aio")
    ap.add_argument("--ways", default="unary,stream")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--server-cores", default="0")
    ap.add_argument("--client-cores", default=None, help="default: every core but the server's")
    args = C.parse(ap, plot=plot)
    args.server_cores = parse_cores(args.server_cores)
    every = sorted(os.sched_getaffinity(0))
    args.client_cores = parse_cores(args.client_cores) if args.client_cores else \
        [c for c in every if c not in args.server_cores] or every
    points = []
    for devices in C.csv_list(args.devices, int):
        for server_kind in C.csv_list(args.servers):
            for way in C.csv_list(args.ways):
                points.append(run_point(server_kind, way, devices, args))
                p = points[-1]
                C.progress(f"{server_kind} server, {way}, {devices} devices: {p['messages_per_s']:.0f}/s, "
                           f"{p['server_cpu_us_per_message']:.0f} us server CPU each, errors {p['errors']}")
    print(C.table(["server", "way", "devices", "messages/s", "server cpu", "server us/message", "client cpu (max)",
                   "errors"],
                  [[p["server"], p["way"], p["devices"], p["messages_per_s"], p["server_cpu_share"],
                    p["server_cpu_us_per_message"], p["client_cpu_share"], p["errors"]] for p in points]))
    settings = {k: v for k, v in vars(args).items() if k != "replot"}
    path = C.write_result(args.out, {"settings": settings, "points": points})
    plot({"points": points}, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png').name}")


if __name__ == "__main__":
    main()
