"""Shared fixtures: the real gemma pair behind a real gRPC verifier on loopback, and `edgekit
api` over it.

Model files come from the cache (`edgekit models pull gemma-270m`; .ci/run does
it). A missing model is an error, not a skip: a skipped integration suite
would look green while testing nothing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgekit import ClientConfig, EdgeClient, LlamaDraftModel, ModelNotFoundError, ServerConfig
from edgekit.testing import FakeDraftModel, InProcessTransport, ToyLanguageModel, toy_server, toy_verifier
from edgekit.transport import GrpcTransport
from edgekit.verifier import VerifierServer

pytest_plugins = ("hub_fake",)  # its fixtures, `tiny` and `hub`, for the tests of the Hub

_MODEL_FIXTURES = frozenset({"gemma_paths", "gemma_server", "gemma_draft", "gpu_toy_target"})  # and whatever uses them


FIRST_ROUTES = ("auto", "speculative", "target-only")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--first-route", choices=FIRST_ROUTES, default=os.environ.get("EDGEKIT_FIRST_ROUTE") or "auto",
        help="route every client's first 'auto' answer this way (ClientConfig.first_route), whatever this "
             "machine's timing says; tests marked `routes` keep their own. Default: EDGEKIT_FIRST_ROUTE, else auto",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"edgekit: first 'auto' answers routed {config.getoption('--first-route')}"


def pytest_configure(config: pytest.Config) -> None:
    """`--first-route`, as EDGEKIT_FIRST_ROUTE: the first route of every client this process makes
    whose config leaves it "auto" (the default), module and session fixtures' included, and of every
    `edgekit` command a test starts. Run the suite both ways, and a test that asserts drafting's
    figures without fixing its route fails on any machine, not only where the timing falls the
    other way (a draft as fast as its target's step)."""
    route = config.getoption("--first-route")
    if route == "auto":
        os.environ.pop("EDGEKIT_FIRST_ROUTE", None)
    else:
        os.environ["EDGEKIT_FIRST_ROUTE"] = route
    _share_the_cores()


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker's llama.cpp contexts take its share of the cores
    (EDGEKIT_THREADS, which the `edgekit` commands a test starts inherit), unless the run sets it.
    Left to the default, every context of every worker takes all the cores, and ggml's threads,
    which meet at a barrier after every op, wait there for a peer the scheduler has set aside for
    another worker's: two workers on 2 cores ran the same greedy test in 30 s each at one thread
    against 37-39 s at two (docs/concepts/architecture.md#where-cis-time-goes)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "EDGEKIT_THREADS" not in os.environ:
        from edgekit.runtime import physical_cores

        os.environ["EDGEKIT_THREADS"] = str(max(1, physical_cores() // workers))


@pytest.fixture(autouse=True)
def _routes_unpinned(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests of the "auto" choice itself (marked `routes`) set the step times they decide on: the
    clients they make are left as they are."""
    if request.node.get_closest_marker("routes") is not None:
        monkeypatch.delenv("EDGEKIT_FIRST_ROUTE", raising=False)


TIERS = ("unit", "integration", "system")
_NOT_UNIT = ("models", "slow", "vllm")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that loads the gemma pair through a fixture is a `models` test, marked or not:
    `-m models` then selects all of them (as `make test-numerics-avx2` does). Every test is marked
    with its tier, the folder it lies in (tests/unit, tests/integration, tests/system), and a unit
    test that needs model files is an error here, not a slow surprise in `make test-fast`."""
    tests = Path(__file__).resolve().parent
    for item in items:
        if _MODEL_FIXTURES & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("models") is None:
            item.add_marker(pytest.mark.models)
        tier = item.path.resolve().relative_to(tests).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lies in tests/unit, tests/integration or tests/system")
        item.add_marker(tier)
        if tier == "unit" and (marked := [m for m in _NOT_UNIT if item.get_closest_marker(m)]):
            raise pytest.UsageError(f"{item.nodeid} is marked {', '.join(marked)}: it belongs in tests/integration "
                                    "or tests/system, as the unit tier runs on toys alone")


def _paths(pair: str):
    from edgekit.models import pair_paths

    try:
        return pair_paths(pair)
    except ModelNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def gemma_paths():
    return _paths("gemma-270m")


@pytest.fixture(scope="session")
def gpu_toy_target(tmp_path_factory, gemma_paths) -> list[dict]:
    """A toy-shaped random target with gemma's tokenizer (`python -m benchmarks gpu.make_target`), F16
    then Q4_K_M, as the script prints them; the tokenizer taken from a tokenizer-only GGUF the script
    wrote first (what a GPU machine without models gets)."""
    root = Path(__file__).resolve().parents[1]

    def run(*options: str) -> list[dict]:
        done = subprocess.run([sys.executable, "-m", "benchmarks", "gpu.make_target", *options], cwd=root,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    out = tmp_path_factory.mktemp("target")
    (saved,) = run("--save-tokenizer", "--tokenizer", str(gemma_paths[1]), "--out", str(out))
    assert saved["bytes"] < 0.05 * gemma_paths[1].stat().st_size  # the keys alone: no tensors
    return run("--shape", "toy", "--tokenizer", saved["path"], "--out", str(out))


@pytest.fixture(scope="session")
def gemma_server(gemma_paths):
    config = ServerConfig(port=0, max_sessions=8, max_context=2048, max_block=16)
    server = VerifierServer(gemma_paths[1], config, name="gemma-3-270m").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gemma_draft(gemma_paths):
    draft = LlamaDraftModel(gemma_paths[0], name="gemma-3-270m-q4_0", n_ctx=2048)
    yield draft
    draft.close()


@pytest.fixture(scope="module")
def gemma_api(gemma_server):
    """`edgekit api` over the gemma pair (API key "sekret", two requests at a time), and its client."""
    from _served import Served

    from edgekit.api import create_app

    client = EdgeClient(gemma_server.address, draft_slots=3)
    served = Served(create_app(client, api_key="sekret", concurrency=2))
    yield served, client
    served.stop()
    client.close()


# -- the toy pair: a target, its noisy draft, and the verifier over the target -----------------------
# (edgekit.testing's helpers, as fixtures: a test that needs its own seed or limits calls them itself)


@pytest.fixture()
def toy_target() -> ToyLanguageModel:
    """A toy target whose answers run long (end of text unlikely): `toy_target.greedy(prompt, n)` is
    what any verifier of it must answer greedily."""
    return ToyLanguageModel(seed=11, eos_bias=-8.0)


@pytest.fixture()
def toy_draft(toy_target: ToyLanguageModel) -> FakeDraftModel:
    """The target's draft: the same toy with noise, so that it disagrees now and then."""
    return FakeDraftModel(ToyLanguageModel(seed=toy_target.seed, noise=1.0, eos_bias=toy_target.eos_bias))


@pytest.fixture()
def toy_in_process(toy_target: ToyLanguageModel) -> Iterator[InProcessTransport]:
    """The reference verifier over the toy target, in this process (`toy_verifier`)."""
    transport = toy_verifier(toy_target, max_sessions=4, max_context=512)
    yield transport
    transport.close()


@pytest.fixture()
def toy_grpc(toy_target: ToyLanguageModel) -> Iterator[VerifierServer]:
    """The reference verifier over the toy target, served over gRPC on a loopback port (`toy_server`):
    clients reach `toy_grpc.address`."""
    with toy_server(toy_target, max_sessions=4, max_context=512) as server:
        yield server


@pytest.fixture()
def api_verifier_gone():
    """`edgekit api` over a toy verifier that has stopped since it started: the server, and the
    name of the model it serves."""
    from _served import Served

    from edgekit.api import create_app
    lm = ToyLanguageModel(seed=2)
    server = toy_server(lm, max_sessions=4, max_context=256).start()
    client = EdgeClient(server.address, draft=FakeDraftModel(ToyLanguageModel(seed=2, noise=0.5)),
                        config=ClientConfig(timeout=2, connect_timeout=2, retry_for=0))
    served = Served(create_app(client))
    server.stop()
    yield served, lm.name
    served.stop()
    client.close()


@pytest.fixture()
def transport(gemma_server):
    t = GrpcTransport(gemma_server.address, ClientConfig(timeout=30))
    yield t
    t.close()


@pytest.fixture()
def silent_address():
    """HOST:PORT of a host that accepts TCP connections and never says a word."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()
