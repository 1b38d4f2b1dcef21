"""Policies by name (issue 53, item 4): one registry each for schedulers, budget policies and
drafting policies (`edgekit.registry`), from which the config checks a name, the command line its
option and the docs their tables. Adding a scheduler is a module of its own and one line: here a
package installed beside edgekit adds one by entry point, and `edgekit serve` serves it by name."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from _serve_process import serving

from edgekit import ConfigError, EdgeClient, GenerationConfig, ServerConfig
from edgekit.registry import BUDGET_POLICIES, DRAFTING, SCHEDULERS, Entry, Registry
from edgekit.verifier import VerifyTimeEstimator

# A scheduler of one's own: FCFS without batching, each batch one session's work.
PLUGIN = textwrap.dedent('''
    from edgekit.verifier.scheduler import FcfsScheduler


    class OneAtATime(FcfsScheduler):
        name = "one-at-a-time"


    def build(estimator, config):
        return OneAtATime(max_rows=config.max_batch_rows, max_works=1, prefill_chunk=config.prefill_chunk,
                          max_queue=config.max_queue)
''')


def _installed(root: Path) -> Path:
    """A package that adds the scheduler by entry point, as `pip install` would leave it on a path."""
    (root / "one_at_a_time.py").write_text(PLUGIN)
    info = root / "one_at_a_time-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: one-at-a-time\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[edgekit.schedulers]\none-at-a-time = one_at_a_time:build\n")
    return root


def test_each_registry_names_what_the_config_takes_and_builds_it():
    assert {"fcfs", "wisp"} <= set(SCHEDULERS.names())
    assert {"none", "goodspeed", "fixed", "random"} <= set(BUDGET_POLICIES.names())
    assert {"auto", "fixed", "predictor", "p-min", "latency"} <= set(DRAFTING.names())
    config = ServerConfig(port=0)
    for name in ("fcfs", "wisp"):
        assert SCHEDULERS.load(name)(VerifyTimeEstimator(), config).name == name
    assert BUDGET_POLICIES.load("none") is None and BUDGET_POLICIES.load("goodspeed")() is not None
    with pytest.raises(ConfigError, match="policy must be one of fcfs, wisp.*got 'lifo'"):
        ServerConfig(policy="lifo")
    with pytest.raises(ConfigError, match="budgets must be one of none, goodspeed"):
        ServerConfig(budgets="equal")
    with pytest.raises(ConfigError, match="drafting must be one of auto, fixed"):
        GenerationConfig(drafting="eager")


def test_a_policy_registered_in_a_program_is_taken_by_name_and_a_name_is_registered_once():
    registry = Registry("scheduler", "policy", "edgekit.test-nothing-installed", [Entry("fcfs", "x:y", "first")])
    registry.register("one-at-a-time", lambda estimator, config: "built", "one session a batch")
    assert registry.names() == ("fcfs", "one-at-a-time")
    assert registry.load("one-at-a-time")(None, None) == "built"
    assert registry.help("Which work runs next") == "Which work runs next: fcfs (first); one-at-a-time (one " \
        "session a batch)."
    with pytest.raises(ConfigError, match="registered already"):
        registry.register("fcfs", "a:b")
    with pytest.raises(ConfigError, match="policy must be one of fcfs, one-at-a-time, got 'lifo'"):
        registry.load("lifo")


def test_a_package_adds_a_policy_by_entry_point(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(_installed(tmp_path)))
    registry = Registry("scheduler", "policy", "edgekit.schedulers", [])  # as SCHEDULERS finds them, afresh
    assert registry.names() == ("one-at-a-time",)
    scheduler = registry.load("one-at-a-time")(VerifyTimeEstimator(), ServerConfig(port=0))
    assert scheduler.name == "one-at-a-time" and scheduler.max_works == 1


@pytest.mark.models
def test_serve_takes_a_scheduler_an_installed_package_adds_and_serves_with_it(tmp_path, gemma_draft):
    with serving(["--pair", "gemma-270m", "--max-sessions", "2", "--max-context", "512", "--policy",
                  "one-at-a-time"], _installed(tmp_path)) as (address, lines):
        assert lines[-1].startswith("scheduling: one-at-a-time;"), lines[-1]
        with EdgeClient(address, pair="gemma-270m", draft=gemma_draft) as client:
            assert client.server_info().scheduling_policy == "one-at-a-time"
            spec = client.generate("def add(a, b):", max_tokens=12, drafting="fixed", draft_k=4).until_done()
            plain = client.generate_target_only("def add(a, b):", max_tokens=12).until_done()
        assert spec.token_ids == plain.token_ids and spec.stats.rounds < 12
