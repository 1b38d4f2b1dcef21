"""Three verifiers behind HAProxy and behind nginx, with the configs shipped in deploy/ (issue 38,
item 2): 16 devices generate through the proxy; one replica is killed and another drained while
every device is mid-answer, and every answer completes identical to target-only decoding.

The replicas are edgekit's verifier server over the toy engine, in this process, each on its own
loopback port: the routing, health checks, draining and resuming are the real ones, the target
is not (the real models prove the integration elsewhere; here 48 sessions must fit two cores).
"Killed" is the server stopped with no grace: its connections are reset, as a dead process's are.

What the tests may expect: every answer equals `TARGET.greedy` (the toy target is exact whatever
the batch); every device that held a session on the killed or drained replica when it went
resumed at least once (a move). The devices wait at fixed rounds for the kill and for the drain
to end, so both land mid-answer on every machine, the drain with every device between two
rounds (a device that kept calling would keep a drained replica serving it, up to the drain's
timeout, behind nginx, which cannot see its health); the test waits for events (rounds reached,
the proxy answering, the drain done), never for a sleep to be long enough.

Binaries: haproxy and nginx from PATH, else from build/proxies/bin (deploy/fetch-proxies.sh,
Debian's packages unpacked without root; `make test` runs it). Without them the tests skip,
unless EDGEKIT_REQUIRE_PROXIES is set (CI sets it), when they fail.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest
from _wait import until

from benchmarks.rigs import proxies as _proxies
from edgekit import ClientConfig, EdgeClient, GenerationConfig, Resumed, RoundEvent
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_server
from edgekit.verifier import VerifierServer

TARGET = ToyLanguageModel(seed=31, eos_bias=-8.0)
DEVICES = 16
TOKENS = 240
KILL_AT, DRAIN_AT = 4, 24  # rounds: every device waits there for the kill, then for the drain

pytestmark = pytest.mark.timeout(240)


def _binary(name: str) -> str:
    found = _proxies.binary(name)
    if found:
        return found
    message = f"{name} not found on PATH nor in build/proxies/bin (bash deploy/fetch-proxies.sh)"
    if os.environ.get("EDGEKIT_REQUIRE_PROXIES"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class Device:
    index: int
    prompt: list[int]
    rounds: int = 0
    resumed: list[Resumed] = field(default_factory=list)
    tokens: list[int] | None = None
    error: BaseException | None = None


class Gate:
    """Where the devices wait for the test: `reached[r]` counts the devices at round r."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.reached = {KILL_AT: 0, DRAIN_AT: 0}
        self.open = {KILL_AT: threading.Event(), DRAIN_AT: threading.Event()}

    def arrive(self, at: int) -> None:
        with self.cond:
            self.reached[at] += 1
            self.cond.notify_all()
        self.open[at].wait(120)

    def wait_for(self, at: int, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.reached[at] >= n, 120), f"{self.reached[at]} of {n} at round {at}"


def _device(proxy: str, d: Device, gate: Gate) -> None:
    draft = FakeDraftModel(ToyLanguageModel(seed=31, noise=1.0, eos_bias=-8.0))
    config = ClientConfig(client_id=f"device-{d.index}", timeout=5, connect_timeout=5, retry_for=90)
    gen = GenerationConfig(max_tokens=TOKENS, draft_k=3, drafting="fixed", stop_at_eos=False)
    try:
        with EdgeClient(proxy, draft=draft, config=config, generation=gen) as client:
            for ev in client.generate(d.prompt):
                if isinstance(ev, RoundEvent):
                    d.rounds += 1
                    if d.rounds in gate.open:
                        gate.arrive(d.rounds)
                elif isinstance(ev, Resumed):
                    d.resumed.append(ev)
                elif ev.type == "final":
                    d.tokens = list(ev.token_ids)
    except BaseException as exc:  # reported by the test, with the device
        d.error = exc


def _held(server: VerifierServer) -> int:
    return len(server.service.sessions)


@pytest.mark.parametrize("kind", ["haproxy", "nginx"])
def test_a_killed_and_a_drained_replica_lose_no_answer_behind_the_shipped_proxy(kind, tmp_path):
    _binary(kind)  # skip (or fail) before starting anything
    replicas = [toy_server(TARGET, max_sessions=DEVICES, max_context=1024, max_block=8).start() for _ in range(3)]
    devices = [Device(i, [1 + (i * 5 + j) % 50 for j in range(4 + i % 6)]) for i in range(DEVICES)]
    gate = Gate()
    report: dict = {"proxy": kind}
    try:
        # the shipped config, answering through the proxy
        with _proxies.proxied(kind, [r.address for r in replicas], tmp_path) as address:
            threads = [threading.Thread(target=_device, args=(address, d, gate), daemon=True) for d in devices]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            gate.wait_for(KILL_AT, DEVICES)  # every device mid-answer, its session open on some replica
            held = [_held(r) for r in replicas]
            assert sum(held) == DEVICES and max(held) < DEVICES, f"sessions per replica {held}: the hash spread none"
            killed = max(range(3), key=lambda i: held[i])  # the replica holding the most sessions
            replicas[killed].stop(grace=0)
            gate.open[KILL_AT].set()
            gate.wait_for(DRAIN_AT, DEVICES)
            held_after_kill = [0 if i == killed else _held(r) for i, r in enumerate(replicas)]
            drained = max((i for i in range(3) if i != killed), key=lambda i: held_after_kill[i])
            # a rolling restart's SIGTERM (`edgekit serve` drains on it) while every device is between
            # two rounds: new sessions refused, health NOT_SERVING, then quiet, and it stops
            replicas[drained].drain(timeout=8.0, quiet=1.0)
            gate.open[DRAIN_AT].set()
            for t in threads:
                t.join(180)
            wall = time.monotonic() - t0
    finally:
        for ev in gate.open.values():
            ev.set()
        for r in replicas:
            r.stop(grace=0)
    errors = {d.index: repr(d.error) for d in devices if d.error}
    assert not errors, f"devices failed: {errors}; {kind}'s log: {(tmp_path / f'{kind}.log').read_text()[-2000:]}"
    wrong = [d.index for d in devices if d.tokens != TARGET.greedy(d.prompt, TOKENS)]
    assert not wrong, f"answers not identical to target-only decoding: devices {wrong}"
    moved = [d for d in devices if d.resumed]
    report.update(
        wall_s=round(wall, 2), sessions_per_replica_before=held, killed=killed, drained=drained,
        sessions_on_drained=held_after_kill[drained], devices_moved=len(moved),
        moves=sum(len(d.resumed) for d in devices),
        reprefilled_tokens=sum(r.reprefilled_tokens for d in devices for r in d.resumed),
        outage_s=round(sum(r.outage_ms for d in devices for r in d.resumed) / 1e3, 2),
        causes=sorted({c for d in devices for r in d.resumed for c in r.causes}),
    )
    print(json.dumps(report))  # the moves and what they cost: `pytest -s` shows them
    # every device whose replica went away moved, at least once; the others need not have
    assert len(moved) >= held[killed] and report["moves"] >= held[killed] + held_after_kill[drained], report
    assert report["reprefilled_tokens"] > 0


def test_a_flooding_client_is_refused_at_the_proxy_and_another_is_not(tmp_path):
    """The shipped HAProxy config's per-client limit (issue 50, part 6): a client sending more calls
    a second than the limit is refused RESOURCE_EXHAUSTED by the proxy, with a back-off hint, before
    its calls reach the verifier; a client beside it, under the limit, answers as if alone. The
    limit is set here to 50 calls a second (the shipped one, 200, is checked apart), so that four
    threads of pings exceed it on any machine and a 40-token generation stays under it. The limit is
    keyed on the source address and the token, never on a header the client picks: the flooder names
    another client id on every call (with the limit on `x-edgekit-client`, it was never refused), and
    the honest client beside it, from the same address (loopback), is told apart by its token."""
    _binary("haproxy")
    from edgekit.errors import LimitExceededError
    from edgekit.transport import CLIENT_HEADER, GrpcTransport

    shipped = _proxies.RATE_RULE.findall(_proxies.CONFIGS["haproxy"].read_text())
    assert [int(n) for _, n in shipped] == [200]
    server = toy_server(TARGET, max_sessions=4, max_context=1024, max_block=8).start()
    stop = threading.Event()
    refusals: list[LimitExceededError] = []
    answered = [0]

    def flood(address: str) -> None:
        with GrpcTransport(address, ClientConfig(token="the-flooders-token", timeout=5)) as t:
            while not stop.is_set():
                t._metadata = (t._metadata[0], (CLIENT_HEADER, uuid.uuid4().hex))  # a new client id a call
                try:
                    t.ping()
                    answered[0] += 1
                except LimitExceededError as exc:
                    refusals.append(exc)

    try:
        with _proxies.proxied("haproxy", [server.address], tmp_path, client_rate=50) as address:
            threads = [threading.Thread(target=flood, args=(address,), daemon=True) for _ in range(4)]
            for t in threads:
                t.start()
            until(lambda: len(refusals) >= 10, "the flooder refused at the proxy", timeout=60)
            gen = GenerationConfig(max_tokens=40, draft_k=4, drafting="fixed", stop_at_eos=False)
            draft = FakeDraftModel(ToyLanguageModel(seed=31, noise=1.0, eos_bias=-8.0))
            # retry_for=0: a refusal would raise
            config = ClientConfig(client_id="honest", token="the-honest-token", timeout=5, retry_for=0)
            prompt = [5, 6, 7]
            before = len(refusals)
            with EdgeClient(address, draft=draft, config=config, generation=gen) as client:
                events = list(client.generate(prompt))
            refused_meanwhile = len(refusals) - before
            stop.set()
            for t in threads:
                t.join(10)
    finally:
        stop.set()
        server.stop(grace=0)
    assert events[-1].token_ids == tuple(TARGET.greedy(prompt, 40))
    assert not [e for e in events if isinstance(e, Resumed)]
    assert refused_meanwhile > 0 and answered[0] > 0  # the flood went on beside it, answered up to the limit
    assert {e.retry_after for e in refusals} == {0.2} and "call rate at the proxy" in str(refusals[0])


@pytest.mark.parametrize("kind", ["haproxy", "nginx"])
def test_the_shipped_proxy_tells_the_verifier_the_devices_address_and_no_client_can_forge_it(kind, tmp_path):
    """Behind the shipped configs, the last `x-forwarded-for` a replica gets is the address the
    device connected from (loopback here), whatever the device wrote in its own: a verifier started
    with --trusted-proxies counts devices by it (edgekit.verifier's Peers reads the last one)."""
    from concurrent import futures

    import grpc

    _binary(kind)
    seen: list[tuple[tuple[str, str], ...]] = []

    def ping(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append(tuple(context.invocation_metadata()))
        return b""

    handler = grpc.method_handlers_generic_handler(
        "edgekit.verifier.v1.Verifier", {"Ping": grpc.unary_unary_rpc_method_handler(ping)})
    replica = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=(handler,))
    port = replica.add_insecure_port("127.0.0.1:0")
    replica.start()
    try:
        with _proxies.proxied(kind, [f"127.0.0.1:{port}"], tmp_path) as address, grpc.insecure_channel(address) as ch:
            ch.unary_unary("/edgekit.verifier.v1.Verifier/Ping")(
                b"", timeout=10, metadata=(("x-forwarded-for", "6.6.6.6"), ("x-edgekit-client", "d")))
    finally:
        replica.stop(0)
    metadata = seen[-1]  # ours, the last call (the rig's own check that the proxy answers came before)
    assert ("x-edgekit-client", "d") in metadata
    forwarded = [v for k, v in metadata if k == "x-forwarded-for"]
    assert forwarded and forwarded[-1].rsplit(",", 1)[-1].strip() == "127.0.0.1", metadata
