"""Several verifier processes on one port over one engine (`FrontEnds`, issue 50).

What the tests may expect: the toy target is deterministic, so greedy answers through any front end
are the target's own decoding, token for token, as a single verifier's are; which front end a
device's connection reaches is the kernel's choice, so the tests ask only that the answers are right,
that every front end is a process of its own over the one engine, and what each front end counted."""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgekit import ClientConfig, EdgeClient, ServerConfig
from edgekit.errors import ConfigError
from edgekit.runtime import ToyLanguageModel
from edgekit.testing import FakeDraftModel, toy_client, toy_verifier
from edgekit.verifier import FrontEnds, ToyEngine, VerifierServer

TARGET = ToyLanguageModel(vocab_size=300, seed=7)


def test_front_ends_answer_greedy_as_one_verifier_does_and_count_their_rounds():
    config = ServerConfig(port=0, max_sessions=8, max_context=512, max_block=8, frontends=2, calibrate="off",
                          metrics_port=0)
    prompts = [[5, 6, 7 + i] for i in range(6)]
    with FrontEnds(ToyEngine(TARGET, n_seq=16, max_context=512), config) as servers:
        assert len(set(servers.pids)) == 2 and servers.port > 0

        def answer(prompt):
            # a channel of its own per device, as devices have: the kernel spreads them over the front ends
            with EdgeClient(servers.address, draft=FakeDraftModel(ToyLanguageModel(300, seed=7, noise=1.0)),
                            config=ClientConfig(timeout=30)) as client:
                return list(client.generate(prompt, mode="greedy", max_tokens=30, draft_k=4,
                                            stop_at_eos=False).until_done().token_ids)

        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(answer, prompts))
        stats = servers.stats()
        assert servers.host.calls > 0
        # each front end's own metrics endpoint (a free port each), its own rounds in it
        assert len(set(servers.metrics_addresses)) == 2
        for address, s in zip(servers.metrics_addresses, stats, strict=True):
            text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
            assert f"edgekit:batch_size_count {float(s.batches)}" in text
    alone = [list(toy_client(TARGET, noise=1.0, verifier=toy_verifier(TARGET, max_context=512), mode="greedy",
                             max_tokens=30, draft_k=4, stop_at_eos=False).generate(p).until_done().token_ids)
             for p in prompts]
    assert got == alone
    assert len(stats) == 2 and sum(s.batches for s in stats) == servers.host.batches > 0  # each its own


def test_a_taken_port_is_refused_and_a_front_end_that_died_does_not_stop_the_drain():
    import os
    import signal
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = ServerConfig(port=taken.getsockname()[1], max_sessions=2, frontends=2, calibrate="off")
        with pytest.raises(ConfigError, match="the port is taken"):
            FrontEnds(ToyEngine(TARGET, n_seq=4, max_context=64), config).start()
    servers = FrontEnds(ToyEngine(TARGET, n_seq=4, max_context=64),
                        ServerConfig(port=0, max_sessions=2, frontends=2, calibrate="off")).start()
    os.kill(servers.pids[1], signal.SIGKILL)
    assert servers.drain(timeout=5, quiet=0.1) < 5  # the other drained, and everything stopped
    assert servers.stats() == []


def test_one_verifier_server_does_not_take_several_front_ends():
    with pytest.raises(ConfigError, match="FrontEnds"):
        VerifierServer(ToyEngine(TARGET, n_seq=8, max_context=64), ServerConfig(port=0, max_sessions=4, frontends=2))
    with pytest.raises(ConfigError, match="frontends must be at least 1"):
        ServerConfig(frontends=0)
