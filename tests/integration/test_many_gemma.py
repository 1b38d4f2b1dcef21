"""Several generations on one client (issue 18, item 2): each in a draft slot of its own,
drafting while the others' blocks are verified, their steps batched. Every task's output is
what it is alone (the target's own greedy output); a task that fails fails alone and gives
its slot back; with more tasks than slots the rest share the first slot."""

from __future__ import annotations

from edgekit import EdgeClient, GenerationConfig


def test_the_gemma_pair_pipelined_writes_each_prompts_target_only_output(gemma_server, gemma_paths):
    prompts = ["def add(a, b):", "The three primary colours are", "Once upon a time", "import numpy as np\n"]
    gen = GenerationConfig(max_tokens=20, drafting="fixed", draft_k=4)
    with EdgeClient(gemma_server.address, draft=gemma_paths[0], draft_slots=4, generation=gen,
                    draft_context=512) as client:
        baseline = [client.generate_target_only(p).until_done().token_ids for p in prompts]
        results = client.generate_many(prompts)
        assert [r.token_ids for r in results] == baseline
        assert client._parts.pool is not None and client._parts.pool.decodes < client._parts.pool.steps


def test_the_gemma_pair_with_proactive_drafting_and_a_plan_writes_target_only_output(gemma_server, gemma_paths):
    from edgekit.plan import Plan

    prompts = ["def add(a, b):", "The three primary colours are", "Once upon a time"]
    gen = GenerationConfig(max_tokens=16, drafting="fixed", draft_k=3, proactive=True)
    with EdgeClient(gemma_server.address, draft=gemma_paths[0], draft_slots=4, generation=gen,
                    draft_context=512) as client:
        baseline = [client.generate_target_only(p).until_done().token_ids for p in prompts]
        alone = [client.generate(p).until_done() for p in prompts]
        assert [r.token_ids for r in alone] == baseline
        assert sum(r.stats.proactive_drafted for r in alone) > 0
        planned = client.generate_many(prompts, plan=Plan(((0, 2), (1,)), 2, 0.0), proactive=False)
        assert [r.token_ids for r in planned] == baseline
