"""Policies by name (issue 53, item 4): one registry each for schedulers, budget policies and
drafting policies (`edgekit.registry`), from which the config checks a name, the command line its
option and the docs their tables. Adding a scheduler is a module of its own and one line: here a
package installed beside edgekit adds one by entry point, and `edgekit serve` serves it by name."""

from __future__ import annotations

import pytest
from _plugin_package import one_at_a_time

from edgekit import ConfigError, GenerationConfig, ServerConfig
from edgekit.registry import BUDGET_POLICIES, DRAFTING, SCHEDULERS, Entry, Registry
from edgekit.verifier import VerifyTimeEstimator


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
    monkeypatch.syspath_prepend(str(one_at_a_time(tmp_path)))
    registry = Registry("scheduler", "policy", "edgekit.schedulers", [])  # as SCHEDULERS finds them, afresh
    assert registry.names() == ("one-at-a-time",)
    scheduler = registry.load("one-at-a-time")(VerifyTimeEstimator(), ServerConfig(port=0))
    assert scheduler.name == "one-at-a-time" and scheduler.max_works == 1
