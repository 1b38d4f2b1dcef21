"""Kill the verifier process mid-answer, start it again, and the answer goes on:
greedy output token-identical to the uninterrupted answer, over real gRPC, on the
gemma pair (issue 16, item 1; issue 52, item 1: at 100, 500 and 1,500 tokens of context).

What the tests may expect: the uninterrupted answer is target-only decoding's, bit for
bit (exact numerics), and so is the resumed one: the reopened session is rebuilt from
its history (the prompt prefilled as it was, the answer so far decoded as the rounds
decoded it), so its KV and every logit after it are what they were
(`tests/unit/client/test_exact_reopen.py` compares them bit for bit). The 500 and 1,500 token cases are
slow (prefills of that length, twice, on one thread).
"""

from __future__ import annotations

import signal
import threading

import pytest
from _serve_process import free_port, kill_group, serve_process, wait_serving
from _wait import until

from edgekit import ClientConfig, EdgeClient, FinalStats, GenerationConfig, Resumed, RoundEvent
from edgekit.transport import GrpcTransport

pytestmark = pytest.mark.numerics










@pytest.mark.parametrize("context", [100, pytest.param(500, marks=pytest.mark.slow),
                                     pytest.param(1500, marks=pytest.mark.slow)])
def test_killing_the_verifier_mid_answer_and_restarting_it_loses_nothing(context, gemma_paths, gemma_draft):
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs = [serve_process(str(gemma_paths[1]), port)]
    try:
        wait_serving(port, procs[0])
        config = ClientConfig(timeout=20, retry_for=120, retry_initial=0.2, retry_max=1.0)
        # the kill lands at about `context` tokens: a prompt of the colors, then a long text before them
        text = "Speculative decoding drafts tokens on a device and checks them on a server. " * (context // 12 + 2)
        prompt = gemma_draft.detokenize(gemma_draft.tokenize(text, add_special=False)[: context - 30])
        prompt += " The three primary colors are"
        gen = GenerationConfig(max_tokens=48, draft_k=4, stream_when_faster=False)  # a session to lose
        with EdgeClient(address, draft=gemma_draft, config=config, generation=gen) as client:
            reference = client.generate_target_only(prompt).until_done().token_ids
            prompt_tokens = len(client.tokenize(prompt))
            events = []
            rounds = 0
            for event in client.generate(prompt):
                events.append(event)
                if isinstance(event, RoundEvent):
                    rounds += 1
                    if rounds == 3:  # mid-answer: kill it, and start another in the background
                        kill_group(procs[0])
                        procs.append(serve_process(str(gemma_paths[1]), port))
                        threading.Thread(target=wait_serving, args=(port, procs[1]), daemon=True).start()
        final = events[-1]
        assert isinstance(final, FinalStats)
        (resumed,) = [e for e in events if isinstance(e, Resumed)]
        assert resumed.reprefilled_tokens > prompt_tokens  # prompt and the answer so far
        assert resumed.outage_ms > 0 and resumed.attempts >= 1
        assert "SessionNotFoundError" in resumed.causes  # the new process knew nothing of the session
        assert final.token_ids == reference
        assert final.stats.outages == 1
    finally:
        for proc in procs:
            kill_group(proc)


def test_sigterm_drains_the_verifier_finishing_the_answer_under_way(gemma_paths, gemma_draft):
    port = free_port()
    # The drain ends once the answer's session closes: on that event, not on a quiet time that a busy
    # machine's drafting could outlast (a block drafted in 2 s was seen with other work running).
    proc = serve_process(str(gemma_paths[1]), port, "--drain-timeout", "120", "--drain-quiet", "60")
    try:
        wait_serving(port, proc)
        gen = GenerationConfig(max_tokens=40, draft_k=4, stream_when_faster=False)  # a session to drain
        config = ClientConfig(timeout=20, retry_for=0)  # nothing may need a retry: the drain serves the answer
        prompt = "Write a short poem about the sea:"
        with EdgeClient(f"127.0.0.1:{port}", draft=gemma_draft, config=config, generation=gen) as client:
            reference = client.generate_target_only(prompt).until_done().token_ids
            signalled = None
            events = []
            for event in client.generate(prompt):
                events.append(event)
                if isinstance(event, RoundEvent) and signalled is None:
                    proc.send_signal(signal.SIGTERM)
                    signalled = True
                    with GrpcTransport(f"127.0.0.1:{port}", ClientConfig(timeout=5)) as probe:
                        # the signal is handled on the server's time
                        until(lambda: probe.health() == "NOT_SERVING", "SIGTERM started draining")
        assert events[-1].token_ids == reference  # the draining verifier served the rest of the answer
        assert not [e for e in events if isinstance(e, Resumed)]
        assert proc.wait(timeout=60) == 0  # the session closed: it stopped, long before the drain's bounds
        log = proc.stderr.read().decode()
        took = float(log.split("stopped after ")[1].split(" s")[0])
        assert "draining" in log and took < 60
    finally:
        kill_group(proc)


def test_killing_one_of_two_verifiers_fails_over_to_the_other_and_loses_nothing(gemma_paths, gemma_draft):
    """Two verifiers of one target; the one in use is killed mid-answer and never comes back: the
    session moves to the other (its fingerprint checked first), and the output is the target's own."""
    ports = [free_port(), free_port()]
    procs = [serve_process(str(gemma_paths[1]), port) for port in ports]
    try:
        for port, proc in zip(ports, procs, strict=True):
            wait_serving(port, proc)
        config = ClientConfig(timeout=20, retry_for=60, retry_initial=0.2, retry_max=1.0)
        prompt = "The three primary colors are"
        gen = GenerationConfig(max_tokens=48, draft_k=4, stream_when_faster=False)  # a session to lose
        verifiers = [f"127.0.0.1:{port}" for port in ports]
        with EdgeClient(verifiers, draft=gemma_draft, config=config, generation=gen) as client:
            reference = client.generate_target_only(prompt).until_done().token_ids
            assert client.transport.address == verifiers[0]
            events, rounds = [], 0
            for event in client.generate(prompt):
                events.append(event)
                if isinstance(event, RoundEvent):
                    rounds += 1
                    if rounds == 3:
                        kill_group(procs[0])
            assert client.transport.address == verifiers[1]
            final = events[-1]
            (resumed,) = [e for e in events if isinstance(e, Resumed)]
            assert "SessionNotFoundError" in resumed.causes and resumed.reprefilled_tokens > 0
            assert isinstance(final, FinalStats)
            assert final.token_ids == reference
    finally:
        for proc in procs:
            kill_group(proc)
