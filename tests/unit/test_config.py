"""The configs (`edgekit.config`): what the environment sets (EDGEKIT_*, EDGEKIT_SERVE_*), typed as
each field is, under a caller's own values; a value that cannot be read is a ConfigError naming the
variable; and EDGEKIT_FIRST_ROUTE, which pins every client whose config leaves its route "auto"."""

from __future__ import annotations

import pytest

from edgekit import ClientConfig, ConfigError, ServerConfig
from edgekit.testing import ToyLanguageModel, toy_client


def test_the_environment_and_a_callers_values_together(monkeypatch):
    monkeypatch.setenv("EDGEKIT_TOKEN", "from-env")
    monkeypatch.setenv("EDGEKIT_TIMEOUT", "7.5")
    c = ClientConfig.from_env(token="from-flag", timeout=3.0)  # raised TypeError before
    assert (c.token, c.timeout) == ("from-flag", 3.0)
    assert (ClientConfig.from_env().token, ClientConfig.from_env().timeout) == ("from-env", 7.5)
    monkeypatch.setenv("EDGEKIT_SERVE_MAX_SESSIONS", "9")
    assert ServerConfig.from_env(max_sessions=3).max_sessions == 3
    assert ServerConfig.from_env().max_sessions == 9


def test_environment_values_are_read_as_the_fields_types(monkeypatch):
    monkeypatch.setenv("EDGEKIT_TLS", "yes")
    monkeypatch.setenv("EDGEKIT_ROUND_STREAMS", "0")
    monkeypatch.setenv("EDGEKIT_SERVE_METRICS_PORT", "9464")  # an optional number, None by default
    monkeypatch.setenv("EDGEKIT_SERVE_THREADS", "3")
    client, server = ClientConfig.from_env(), ServerConfig.from_env()
    assert (client.tls, client.round_streams, server.metrics_port, server.threads) == (True, False, 9464, 3)


@pytest.mark.parametrize(("variable", "value", "what"), [
    ("EDGEKIT_TIMEOUT", "soon", "float"), ("EDGEKIT_SERVE_MAX_SESSIONS", "many", "int"),
    ("EDGEKIT_SERVE_THREADS", "2.5", "int"),
])
def test_a_value_that_cannot_be_read_names_its_variable(monkeypatch, variable, value, what):
    monkeypatch.setenv(variable, value)
    config = ServerConfig if variable.startswith("EDGEKIT_SERVE_") else ClientConfig
    with pytest.raises(ConfigError, match=f"{variable}='{value}' is not a valid {what}"):
        config.from_env()


def test_a_value_read_but_out_of_range_is_refused_by_the_configs_own_checks(monkeypatch):
    monkeypatch.setenv("EDGEKIT_TIMEOUT", "-1")
    with pytest.raises(ConfigError, match="timeout and connect_timeout must be positive"):
        ClientConfig.from_env()


@pytest.mark.routes  # the test sets EDGEKIT_FIRST_ROUTE itself: conftest's --first-route leaves it alone
def test_edgekit_first_route_pins_every_client_whose_config_leaves_it_auto(monkeypatch):
    target = ToyLanguageModel(seed=3)
    monkeypatch.setenv("EDGEKIT_FIRST_ROUTE", "target-only")
    with toy_client(target) as client:
        assert client.config.first_route == "target-only"
        assert client.generate("ab", max_tokens=6).until_done().stats.drafting == "target-only"
    with toy_client(target, config=ClientConfig(first_route="speculative")) as client:  # its own pin stays
        assert client.config.first_route == "speculative"
        assert client.generate("ab", max_tokens=6).until_done().stats.drafting != "target-only"
    monkeypatch.setenv("EDGEKIT_FIRST_ROUTE", "sideways")
    with pytest.raises(ConfigError, match="first_route must be auto, speculative or target-only, got 'sideways'"):
        toy_client(target)
    monkeypatch.delenv("EDGEKIT_FIRST_ROUTE")
    with toy_client(target) as client:
        assert client.config.first_route == "auto"
