"""What deploy/ ships for operators (issue 38, items 2-4): the Kubernetes manifests validated
offline against Kubernetes' own schemas (kubernetes-validate ships them) and consistent with
`edgekit serve`; the Grafana dashboard's every query naming metrics a verifier exports; the
HAProxy health check's bytes as its generator makes them. (The proxies themselves run in
tests/system/test_fleet_proxy.py.)"""

from __future__ import annotations

import copy
import json
import re
import sys
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import typer
import yaml
from _paths import ROOT

from edgekit import EdgeClient, GenerationConfig
from edgekit.cli.app import app
from edgekit.protocol import SERVICE_NAME
from edgekit.testing import FakeDraftModel, ToyLanguageModel, toy_server

DEPLOY = ROOT / "deploy"
KUBERNETES = ("1.30.0", kubernetes_validate.latest_version())  # the oldest kept in support, the newest


def _documents() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d]


def _container() -> dict:
    deployment = next(d for _, d in _documents() if d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _flags(container: dict) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"] if a.startswith("--"))


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_manifest_is_valid_against_kubernetes_schemas_strictly(version):
    docs = _documents()
    assert {d["kind"] for _, d in docs} >= {"Deployment", "Service", "Ingress", "PodDisruptionBudget"}
    for name, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"deploy/kubernetes/{name}, {doc['kind']} {doc['metadata']['name']}: {exc}")


def test_the_validator_refuses_a_misspelt_field():
    """The check above can fail: a probe's field misspelt is refused."""
    doc = next(d for _, d in _documents() if d["kind"] == "Deployment")
    bad = copy.deepcopy(doc)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["servce"] = SERVICE_NAME
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES[-1], strict=True)


def test_the_verifier_container_is_consistent_with_edgekit_serve(tmp_path):
    container = _container()
    pod = next(d for _, d in _documents() if d["kind"] == "Deployment")["spec"]["template"]
    flags = _flags(container)
    # the arguments are edgekit serve's: its parser takes every one, with its type and range
    assert container["command"] == ["edgekit"] and container["args"][0] == "serve"
    serve = typer.main.get_command(app).commands["serve"]
    tokens = tmp_path / "tokens"  # the Secret's file, here
    tokens.write_text("fleet 0123456789abcdef\n")
    args = [f"--tokens-file={tokens}" if a.startswith("--tokens-file=") else a for a in container["args"][1:]]
    ctx = serve.make_context("serve", args)  # parses; serves nothing
    assert ctx.params["port"] == int(flags["port"]) and ctx.params["policy"] == flags["policy"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == int(flags["port"]) and ports["metrics"] == int(flags["metrics-port"])
    assert flags["host"] == "0.0.0.0"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == ports["grpc"], probe
    assert container["readinessProbe"]["grpc"]["service"] == SERVICE_NAME  # NOT_SERVING while draining
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == ports["metrics"]
    # SIGTERM drains: the grace period covers the preStop pause and the whole drain
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > container["lifecycle"]["preStop"]["sleep"]["seconds"] + float(flags["drain-timeout"])
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(Path(flags["tokens-file"]).parent) in mounts  # the tokens come from a Secret
    secrets = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert "edgekit-verifier-tokens" in secrets


def test_the_ingress_hashes_on_the_header_every_call_carries_as_the_nginx_recipe_does():
    from edgekit.transport import CLIENT_HEADER

    ingress = next(d for _, d in _documents() if d["kind"] == "Ingress")
    variable = "$http_" + CLIENT_HEADER.replace("-", "_")
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/upstream-hash-by"] == variable
    assert f"hash {variable} consistent;" in (DEPLOY / "nginx" / "nginx.conf").read_text()
    assert f"balance hdr({CLIENT_HEADER})" in (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    assert ingress["spec"]["tls"][0]["secretName"]  # TLS from a Secret


def test_haproxys_health_request_is_the_generators_for_the_verifier_service():
    sys.path.insert(0, str(DEPLOY / "haproxy"))
    try:
        import health_request
    finally:
        sys.path.pop(0)
    config = (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    assert re.search(r"tcp-check send-binary ([0-9a-f]+)", config).group(1) == health_request.request().hex()
    assert re.search(r"tcp-check expect binary ([0-9a-f]+)", config).group(1) == health_request.SERVING.hex()
    assert health_request.SERVICE == SERVICE_NAME


def _exported_names() -> set[str]:
    """The sample names a verifier's /metrics gives, with draft budgets on, after some rounds."""
    target = ToyLanguageModel(seed=2, eos_bias=-8.0)
    with toy_server(target, max_sessions=2, max_context=256, metrics_port=0, budgets="goodspeed") as verifier:
        gen = GenerationConfig(max_tokens=16, drafting="fixed", draft_k=3, stop_at_eos=False)
        with EdgeClient(verifier.address, draft=FakeDraftModel(target), generation=gen) as client:
            client.generate([1, 2, 3]).until_done()
        text = urllib.request.urlopen(f"http://{verifier.metrics_address}/metrics", timeout=10).read().decode()
    return {re.match(r"[^\s{]+", line).group(0) for line in text.splitlines() if line and not line.startswith("#")}


def test_every_dashboard_query_names_only_metrics_a_verifier_exports():
    dashboard = json.loads((DEPLOY / "grafana" / "edgekit-verifier.json").read_text())
    exported = _exported_names()
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"]]
    named: set[str] = set()
    for q in queries:
        names = set(re.findall(r"edgekit:[A-Za-z0-9_:]+", q))
        assert names, f"a query that names no edgekit metric: {q}"
        assert q.count("(") == q.count(")"), q
        named |= names
    assert not named - exported, f"queries name metrics no verifier exports: {sorted(named - exported)}"
    # what the issue asks the dashboard to show
    for wanted in ("edgekit:spec_decode_num_accepted_tokens_total",
                   "edgekit:spec_decode_num_accepted_tokens_per_pos_total", "edgekit:slo_rounds_total",
                   "edgekit:queue_time_seconds_bucket", "edgekit:slo_violations_total",
                   "edgekit:budget_capacity", "edgekit:budget_tokens_bucket"):
        assert wanted in named, wanted
