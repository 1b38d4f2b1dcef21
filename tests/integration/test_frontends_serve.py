"""Several verifier processes on one port over one engine (`FrontEnds`, issue 50).

What the tests may expect: the toy target is deterministic, so greedy answers through any front end
are the target's own decoding, token for token, as a single verifier's are; which front end a
device's connection reaches is the kernel's choice, so the tests ask only that the answers are right,
that every front end is a process of its own over the one engine, and what each front end counted."""

from __future__ import annotations

import pytest
from _serve_process import free_port, kill_group, serve_process, wait_serving

from edgekit import ClientConfig, EdgeClient


@pytest.mark.models
def test_edgekit_serve_with_front_ends_answers_as_the_target_and_drains_on_sigterm(gemma_paths, gemma_draft,
                                                                                   gemma_server):
    """`edgekit serve --frontends 2` on the gemma target: greedy through it is the target's own
    decoding (exact numerics), its log-probabilities too, and SIGTERM to its whole process group (a service manager's, a
    terminal's Ctrl-C) drains every front end and stops."""
    import os
    import signal

    from edgekit import GenerationConfig

    port = free_port()
    proc = serve_process(str(gemma_paths[1]), port, "--frontends", "2", "--drain-quiet", "1")
    try:
        wait_serving(port, proc)
        gen = GenerationConfig(max_tokens=24, draft_k=4, stream_when_faster=False)
        with EdgeClient(f"127.0.0.1:{port}", draft=gemma_draft, config=ClientConfig(timeout=60),
                        generation=gen) as client:
            prompt = "def fibonacci(n):"
            assert client.generate(prompt).until_done().token_ids == client.generate_target_only(
                prompt).until_done().token_ids
            # log-probabilities take whole rows (262,144 logits, 1 MB each: through shared memory from
            # the engine's process): a greedy answer's equal target-only decoding's and one verifier
            # process's, bit for bit
            spec = client.generate(prompt, logprobs=5).until_done()
            alone = client.generate_target_only(prompt, logprobs=5).until_done()
            assert spec.token_ids == alone.token_ids and spec.logprobs == alone.logprobs and len(spec.logprobs) == 24
        with EdgeClient(gemma_server.address, draft=gemma_draft, config=ClientConfig(timeout=60),
                        generation=gen) as client:
            assert client.generate(prompt, logprobs=5).until_done().logprobs == spec.logprobs
        os.killpg(proc.pid, signal.SIGTERM)  # the whole group, as a service manager signals it
        assert proc.wait(timeout=120) == 0
        log = proc.stderr.read().decode()
        assert "2 front ends, up to 4 sessions each" in log and "stopped after" in log
    finally:
        kill_group(proc)
