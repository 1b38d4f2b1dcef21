"""`DelayProxy`: a TCP relay that delays each direction by half the RTT, with
jitter and retransmission-style loss, preserving byte order (as TCP does), and
that can lose the link altogether for a while (`outage`): "reset" cuts every
connection and refuses new ones (a restarted verifier, an interface that went
down), "silent" holds every byte until the link is back (out of radio range:
TCP retransmits what was sent once the path returns, new connections hang).

A rate each way (`uplink_mbps`, `downlink_mbps`) makes each direction a bottleneck
that every connection shares: bytes leave one after another at that rate, TCP/IP
headers counted per segment, then take the one-way delay. A queue that never drops
(as `tc tbf` with a deep limit; `Testbed` shapes in the kernel where it has root),
paced in user space, so any machine can emulate a slow link. Its timing is as good
as the event loop's timers (about a millisecond)."""

from __future__ import annotations

import asyncio
import math
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edgekit.link import MIN_RTO_MS

__all__ = ["DelayProxy", "Impairment"]

MSS = 1448  # bytes of payload per TCP segment on an Ethernet-sized path
HEADERS = 52  # bytes of IPv4 and TCP headers (with timestamps) per segment


@dataclass
class Impairment:
    rtt_ms: float = 0.0  # added round trip, half each way
    jitter_ms: float = 0.0  # |N(0, jitter)| extra per chunk, order kept
    loss: float = 0.0  # per-segment loss probability; a loss costs RTO + RTT
    uplink_mbps: float = 0.0  # client to upstream, megabits per second on the wire; 0: unlimited
    downlink_mbps: float = 0.0  # upstream to client; 0: unlimited


class DelayProxy:
    """Listens on `listen` and relays each connection to `upstream`.

    Settings (`impairment`) may change while it runs; they apply to bytes read
    afterwards. Counts bytes each way, so payloads can be measured on the wire.
    """

    def __init__(self, upstream: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0), *, seed: int = 0) -> None:
        self.upstream = upstream
        self.impairment = Impairment()
        self.bytes_up = 0
        self.bytes_down = 0
        self.losses = 0
        self._rng = random.Random(seed)
        self._sock = socket.create_server(listen)
        host, port = self._sock.getsockname()[:2]
        self.address = f"{host}:{port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="delay-proxy", daemon=True)
        self._ready = threading.Event()
        self.down: str | None = None  # None, or the kind of outage under way
        self._up = asyncio.Event()  # set while the link is up (used in the proxy's loop only)
        self._writers: set[asyncio.StreamWriter] = set()
        self._free_at = {"up": 0.0, "down": 0.0}  # when each direction's bottleneck is next idle (loop only)

    def start(self) -> DelayProxy:
        self._thread.start()
        self._ready.wait(5)
        return self

    def reset_counters(self, seed: int | None = None) -> None:
        """Zeroes the byte and loss counts; a seed restarts the jitter and loss draws, so that runs
        compared side by side meet the same sequence of losses (common random numbers)."""
        self.bytes_up = self.bytes_down = self.losses = 0
        if seed is not None:
            self._rng.seed(seed)

    def outage(self, kind: str = "reset") -> None:
        """Loses the link until `restore()`: "reset" or "silent" (see the module's docstring).
        Returns once the link is down: bytes sent after it are held or refused."""
        if kind not in ("reset", "silent"):
            raise ValueError(f"an outage is 'reset' or 'silent', not {kind!r}")
        self._in_loop(self._go_down, kind)

    def restore(self) -> None:
        """Brings the link back; held bytes flow again, in order. Returns once it is up."""
        self._in_loop(self._come_up)

    def _in_loop(self, change: Callable[..., None], *args: object) -> None:
        """Runs `change` in the proxy's loop and waits for it: a caller that changes the link
        and then sends knows which side of the change its bytes fall on, however busy the
        machine is."""
        if not self._loop.is_running() or threading.current_thread() is self._thread:
            change(*args)
            return

        async def run() -> None:
            change(*args)

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def close(self) -> None:
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        self._thread.join(5)
        self._sock.close()

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.get_running_loop().stop()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- inside the loop ------------------------------------------------------------

    def _go_down(self, kind: str) -> None:
        self.down = kind
        self._up.clear()
        if kind == "reset":
            for w in list(self._writers):
                w.transport.abort()  # RST: both ends see the connection fail at once
            self._free_at = {"up": 0.0, "down": 0.0}  # what was queued on the bottlenecks is gone with them

    def _come_up(self) -> None:
        self.down = None
        self._free_at = {"up": 0.0, "down": 0.0}  # what a silent outage held is booked again as it goes
        self._up.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._up.set()

        async def serve() -> None:
            await asyncio.start_server(self._handle, sock=self._sock)
            self._ready.set()

        self._loop.run_until_complete(serve())
        self._loop.run_forever()

    def _delay_s(self, nbytes: int) -> float:
        imp = self.impairment
        d = imp.rtt_ms / 2
        if imp.jitter_ms:
            d += abs(self._rng.gauss(0.0, imp.jitter_ms))
        if imp.loss:
            segments = max(1, math.ceil(nbytes / MSS))
            if self._rng.random() < 1 - (1 - imp.loss) ** segments:
                self.losses += 1
                d += MIN_RTO_MS + imp.rtt_ms
        return d / 1e3

    def _sent_at(self, direction: str, nbytes: int, now: float) -> float:
        """When the last of `nbytes` read now leaves the direction's bottleneck (`now` where it has no
        rate): after what is queued before them, at the rate, with a header per segment."""
        imp = self.impairment
        mbps = imp.uplink_mbps if direction == "up" else imp.downlink_mbps
        if mbps <= 0:
            return now
        wire_bits = 8 * (nbytes + HEADERS * max(1, math.ceil(nbytes / MSS)))
        done = max(now, self._free_at[direction]) + wire_bits / (mbps * 1e6)
        self._free_at[direction] = done
        return done

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._relay(reader, writer)
        except asyncio.CancelledError:
            writer.close()  # the proxy is closing

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down == "reset":
            writer.transport.abort()  # connection refused, as a host that is gone answers
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        for w in (writer, up_writer):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self._pump(reader, up_writer, "up"), self._pump(up_reader, writer, "down"))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def release() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not self._up.is_set():  # a silent outage: the bytes go when the path is back,
                    await self._up.wait()  # through the bottleneck again (held, they had not crossed it)
                    wait = self._sent_at(direction, len(data), time.monotonic()) - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(release())
        last_due = 0.0
        try:
            while data := await reader.read(65536):
                if direction == "up":
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
                sent = self._sent_at(direction, len(data), time.monotonic())
                last_due = max(last_due, sent + self._delay_s(len(data)))  # in order, as TCP delivers
                queue.put_nowait((last_due, data))
        except (ConnectionError, OSError):
            pass
        queue.put_nowait((0.0, None))
        try:
            await sender
        except (ConnectionError, OSError):
            pass
        self._writers.discard(writer)
