"""Policies by name (issue 53, item 4): one registry each for schedulers, budget policies and
drafting policies (`edgekit.registry`), from which the config checks a name, the command line its
option and the docs their tables. Adding a scheduler is a module of its own and one line: here a
package installed beside edgekit adds one by entry point, and `edgekit serve` serves it by name."""

from __future__ import annotations

import pytest
from _plugin_package import one_at_a_time
from _serve_process import serving

from edgekit import EdgeClient


@pytest.mark.models
def test_serve_takes_a_scheduler_an_installed_package_adds_and_serves_with_it(tmp_path, gemma_draft):
    with serving(["--pair", "gemma-270m", "--max-sessions", "2", "--max-context", "512", "--policy",
                  "one-at-a-time"], one_at_a_time(tmp_path)) as (address, lines):
        assert lines[-1].startswith("scheduling: one-at-a-time;"), lines[-1]
        with EdgeClient(address, pair="gemma-270m", draft=gemma_draft) as client:
            assert client.server_info().scheduling_policy == "one-at-a-time"
            spec = client.generate("def add(a, b):", max_tokens=12, drafting="fixed", draft_k=4).until_done()
            plain = client.generate_target_only("def add(a, b):", max_tokens=12).until_done()
        assert spec.token_ids == plain.token_ids and spec.stats.rounds < 12
