"""Chart tests of who may reach what: /adapt never rendered open, each pod holding only the secrets it uses, the
scaler's own database role, and the metrics on a port of their own."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

from service.settings import ServiceSettings

GENERATED_KEY = re.compile(r"^[A-Za-z0-9]{40}$")


def _server_env(deploy, docs: list[dict[str, Any]]) -> dict[str, str]:
    """The environment a serving pod gets: its ConfigMap, then its Secret (envFrom order)."""
    container = deploy.pod_spec(deploy.find(docs, "Deployment"))["containers"][0]
    refs = container["envFrom"]
    assert refs[0] == {"configMapRef": {"name": deploy.find(docs, "ConfigMap")["metadata"]["name"]}}
    env = dict(deploy.find(docs, "ConfigMap")["data"])
    secret = deploy.find(docs, "Secret")
    assert refs[1] == {"secretRef": {"name": secret["metadata"]["name"]}}
    return env | secret["stringData"]


def _settings(monkeypatch, env: dict[str, str]) -> ServiceSettings:
    for name in [n for n in os.environ if n.startswith("EMBED_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return ServiceSettings()


def test_default_render_gives_the_server_a_generated_admin_key(deploy, monkeypatch) -> None:
    docs = deploy.render()
    env = _server_env(deploy, docs)
    assert env["EMBED_ADAPT_ENABLED"] == "true" and env["EMBED_HOST"] == "0.0.0.0"
    assert GENERATED_KEY.match(env["EMBED_ADMIN_API_KEYS"]), "the default render must carry a generated admin key"
    assert env["EMBED_API_KEYS"] == ""  # embedding stays the operator's choice
    # The server's own rule accepts what the chart renders: it starts, and /adapt needs the admin key.
    assert _settings(monkeypatch, env).open_adapt_error() is None
    # A fresh render (`helm template`, a first install) draws a new key: nothing is baked into the chart.
    helm = deploy.tool("bin/helm")
    again = deploy.run([helm, "template", deploy.release, deploy.chart, "-s", "templates/secret.yaml"])
    assert again.returncode == 0, again.stderr
    assert env["EMBED_ADMIN_API_KEYS"] not in again.stdout


def test_the_server_rule_refuses_a_render_without_the_admin_key(deploy, monkeypatch) -> None:
    """The check above can fail: the same environment without the admin key is refused by the server."""
    env = _server_env(deploy, deploy.render()) | {"EMBED_ADMIN_API_KEYS": ""}
    assert "EMBED_ADMIN_API_KEYS" in (_settings(monkeypatch, env).open_adapt_error() or "")


@pytest.mark.parametrize(
    ("values", "admin"),
    [
        (["--set", "auth.adminApiKeys={a1,a2}"], "a1,a2"),
        (["--set", "config.adapt_enabled=false"], ""),
        (["--set", "config.adapt_enabled=false", "--set", "auth.adminApiKeys={a1}"], "a1"),
    ],
    ids=["explicit-keys", "adapt-off", "adapt-off-explicit-keys"],
)
def test_explicit_keys_or_adapt_off_generate_nothing(deploy, monkeypatch, values: list[str], admin: str) -> None:
    env = _server_env(deploy, deploy.render(*values))
    assert env["EMBED_ADMIN_API_KEYS"] == admin
    assert _settings(monkeypatch, env).open_adapt_error() is None


def test_existing_secret_is_used_as_is(deploy) -> None:
    docs = deploy.render("--set", "auth.existingSecret=my-keys")
    assert not [d for d in docs if d["kind"] == "Secret"]  # no key generated beside the operator's Secret
    container = deploy.pod_spec(deploy.find(docs, "Deployment"))["containers"][0]
    assert {"secretRef": {"name": "my-keys"}} in container["envFrom"]


def _notes(deploy, *values: str) -> str:
    helm = deploy.tool("bin/helm")
    result = deploy.run([helm, "install", deploy.release, deploy.chart, "-n", deploy.namespace, "--dry-run=client",
                         *values])  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_tell_how_to_read_the_generated_admin_key(deploy) -> None:
    notes = _notes(deploy)
    assert "kubectl -n embedder get secret rel-embedder-auth -o jsonpath='{.data.EMBED_ADMIN_API_KEYS}'" in notes
    assert "start /adapt jobs" not in notes  # the old warning that /adapt is open
    for values in (["--set", "auth.adminApiKeys={a1}"], ["--set", "config.adapt_enabled=false"],
                   ["--set", "auth.existingSecret=my-keys"]):  # fmt: skip
        assert "EMBED_ADMIN_API_KEYS" not in _notes(deploy, *values), values


# --- least privilege ------------------------------------------------------------------------------------


def test_helm_test_pod_mounts_only_the_client_keys(deploy) -> None:
    for docs in (deploy.render(), deploy.render_production()):
        pod = deploy.find(docs, "Pod", "-test-embeddings")
        spec = deploy.pod_spec(pod)
        (container,) = spec["containers"]
        assert "env" not in container and "envFrom" not in container
        auth = next(v for v in spec["volumes"] if v["name"] == "auth")
        assert auth["secret"]["items"] == [{"key": "EMBED_API_KEYS", "path": "EMBED_API_KEYS"}]
        assert "/var/run/secrets/embedder/EMBED_API_KEYS" in container["args"][0]


def test_scaled_workers_get_the_store_url_and_no_api_key(deploy) -> None:
    docs = deploy.render_production()
    (container,) = deploy.pod_spec(deploy.find(docs, "ScaledJob", "-adapt-worker"))["containers"]
    assert container["envFrom"] == [{"configMapRef": {"name": "rel-embedder"}}]
    assert container["env"] == [
        {"name": "EMBED_ADAPT_STORE_URL",
         "valueFrom": {"secretKeyRef": {"name": "embedder-keys", "key": "EMBED_ADAPT_STORE_URL"}}}
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "secret", "key"),
    [
        ([], "embedder-keys", "EMBED_ADAPT_STORE_URL"),
        (["--set", "adaptWorker.keda.connectionSecret=keda-reader"], "keda-reader", "connection"),
        (["--set", "adaptWorker.keda.connectionSecret=keda-reader", "--set", "adaptWorker.keda.connectionKey=url"],
         "keda-reader", "url"),
    ],
    ids=["store-url", "own-secret", "own-secret-and-key"],
)  # fmt: skip
def test_the_scaler_can_read_the_queue_with_a_role_of_its_own(deploy, values: list[str], secret: str, key: str):
    docs = deploy.render_production(*values)
    auth = deploy.find(docs, "TriggerAuthentication", "-adapt-store")
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "connection", "name": secret, "key": key}]
    # the workers keep the store's read-write URL whatever the scaler uses
    (container,) = deploy.pod_spec(deploy.find(docs, "ScaledJob"))["containers"]
    assert container["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "embedder-keys"


# --- the metrics port -----------------------------------------------------------------------------------


def test_metrics_have_their_own_port_and_only_the_scrapers_reach_it(deploy) -> None:
    docs = deploy.render_production()
    assert deploy.values()["config"]["metrics_port"] == 9090
    assert deploy.find(docs, "ConfigMap")["data"]["EMBED_METRICS_PORT"] == "9090"
    (container,) = deploy.pod_spec(deploy.find(docs, "Deployment"))["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "metrics": 9090}
    service_ports = {p["name"]: p for p in deploy.find(docs, "Service")["spec"]["ports"]}
    assert service_ports["metrics"]["targetPort"] == "metrics" and service_ports["metrics"]["port"] == 9090
    monitor = deploy.find(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    rules = deploy.find(docs, "NetworkPolicy")["spec"]["ingress"]
    values = deploy.values(production=True)["networkPolicy"]
    policy_selector = deploy.find(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]
    helm_test = {"podSelector": {"matchLabels": {**policy_selector, "app.kubernetes.io/component": "helm-test"}}}
    assert rules == [
        {"ports": [{"port": "http", "protocol": "TCP"}], "from": [*values["ingressFrom"], helm_test]},
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": values["metricsFrom"]},
    ]
    scrapers = values["metricsFrom"]
    assert not [peer for peer in scrapers if peer in rules[0]["from"]], "the scrapers must not reach the HTTP port"


def test_without_scrapers_named_the_metrics_port_admits_the_api_peers(deploy) -> None:
    rules = deploy.find(deploy.render(), "NetworkPolicy")["spec"]["ingress"]
    assert rules == [
        {"ports": [{"port": "http", "protocol": "TCP"}], "from": [{"podSelector": {}}]},
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [{"podSelector": {}}]},
    ]


def test_metrics_port_zero_keeps_the_metrics_on_the_http_port(deploy) -> None:
    docs = deploy.render_production("--set", "config.metrics_port=0")
    (container,) = deploy.pod_spec(deploy.find(docs, "Deployment"))["containers"]
    assert [p["name"] for p in container["ports"]] == ["http"]
    assert [p["name"] for p in deploy.find(docs, "Service")["spec"]["ports"]] == ["http"]
    assert deploy.find(docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "http"
    (rule,) = deploy.find(docs, "NetworkPolicy")["spec"]["ingress"]
    values = deploy.values(production=True)["networkPolicy"]
    policy_selector = deploy.find(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]
    helm_test = {"podSelector": {"matchLabels": {**policy_selector, "app.kubernetes.io/component": "helm-test"}}}
    peers = [*values["ingressFrom"], helm_test, *values["metricsFrom"]]
    assert rule == {"ports": [{"port": "http", "protocol": "TCP"}], "from": peers}


def _refused(deploy, *values: str) -> str:
    """stderr of a render the chart must refuse."""
    result = deploy.run([deploy.tool("bin/helm"), "template", deploy.release, deploy.chart, *values])
    assert result.returncode != 0, f"{values} rendered"
    return result.stderr


@pytest.mark.parametrize("service_type", ["LoadBalancer", "NodePort"])
def test_a_service_reached_from_outside_needs_the_policy_to_admit_address_ranges(deploy, service_type: str) -> None:
    """Traffic through a NodePort or LoadBalancer comes from outside the cluster (or from the nodes): only an ipBlock
    peer admits it. The chart refuses a policy that would drop it silently, and keeps the metrics to the scrapers."""
    external = ("--set", f"service.type={service_type}")
    stderr = _refused(deploy, *external)
    assert f"service.type={service_type} exposes port http outside the cluster" in stderr
    assert "add the clients' ranges to networkPolicy.ingressFrom" in stderr
    production = ("-f", str(deploy.production_values))
    assert "(pod and namespace selectors only)" in _refused(deploy, *production, *external)
    clients = {"ipBlock": {"cidr": "203.0.113.0/24"}}
    ranges = ("--set-json", "networkPolicy.ingressFrom=" + json.dumps([clients, {"podSelector": {}}]))
    # The ranges alone would open the metrics port (on the same Service) to them too, without a key.
    assert "set networkPolicy.metricsFrom to your scrapers" in _refused(deploy, *external, *ranges)
    for values in ((*external, *ranges, "--set", "config.metrics_port=0"), (*production, *external, *ranges)):
        http_rule, *metrics_rule = deploy.find(deploy.render(*values), "NetworkPolicy")["spec"]["ingress"]
        assert http_rule["ports"] == [{"port": "http", "protocol": "TCP"}]
        assert http_rule["from"][:2] == [clients, {"podSelector": {}}]
        assert all(clients not in rule["from"] for rule in metrics_rule)
    assert deploy.find(deploy.render(*production, *external, *ranges), "Service")["spec"]["type"] == service_type
    # No policy, nothing dropped; and a ClusterIP Service keeps the in-cluster default.
    assert "NetworkPolicy" not in [d["kind"] for d in deploy.render(*external, "--set", "networkPolicy.enabled=false")]
    deploy.render(*ranges)


def test_the_documented_values_for_outside_clients_render(deploy, tmp_path) -> None:
    """docs/DEPLOY.md "Reached from outside the cluster" shows values the chart accepts, as written there."""
    doc = (deploy.repo / "docs" / "DEPLOY.md").read_text()
    section = doc.split("### Reached from outside the cluster", 1)[1].split("\n## ", 1)[0]
    values = tmp_path / "outside.yaml"
    values.write_text(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    docs = deploy.render("-f", str(values))
    assert deploy.find(docs, "Service")["spec"]["type"] == "LoadBalancer"
    assert any("ipBlock" in peer for peer in deploy.find(docs, "NetworkPolicy")["spec"]["ingress"][0]["from"])


def _docs_sql(deploy) -> str:
    """The read-only role of docs/DEPLOY.md "Security", as written there."""
    doc = (deploy.repo / "docs" / "DEPLOY.md").read_text()
    security = doc.split("## Security", 1)[1].split("\n## ", 1)[0]
    return security.split("```sql\n", 1)[1].split("```", 1)[0]


def test_the_documented_read_only_role_runs_the_scalers_query_and_nothing_more(deploy, postgres) -> None:
    import uuid

    import psycopg

    from adapt_jobs.store import JobStore

    url = postgres.new_database()
    store = JobStore(url)  # creates the tables, as the first service or worker does
    store.create({"base_model": "b", "name": "n"}, corpus_dir="/c", n_documents=1, max_pending=9, max_attempts=2)
    role = f"scaler_{uuid.uuid4().hex[:8]}"  # roles are cluster-wide: one of its own per run
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in _docs_sql(deploy).replace("embedder_scaler", role).split(";"):
            if statement.strip():
                conn.execute(statement)
    query = deploy.find(deploy.render_production(), "ScaledJob")["spec"]["triggers"][0]["metadata"]["query"]
    as_scaler = url.replace("postgresql://postgres@", f"postgresql://{role}@")
    with psycopg.connect(as_scaler, autocommit=True) as conn:
        assert conn.execute(query).fetchone()[0] == 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE adapt_jobs SET state = 'cancelled'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM adapt_events")
