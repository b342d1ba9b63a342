"""Chart tests of install, test and rollout order: hooks find what they need, `helm test` reaches the Service, the
release's own names pass the Host check, and values the pods could not run with are refused at render time."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from typing import Any

import pytest


def _hook_weight(doc: dict[str, Any]) -> int:
    return int(doc["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))


def test_gate_service_account_exists_before_the_gate_runs(deploy) -> None:
    """Pre-install hooks run before the ordinary ServiceAccount is created: the gate's must be an earlier hook."""
    docs = deploy.render()
    job = deploy.find(docs, "Job", "-gate")
    name = deploy.pod_spec(job)["serviceAccountName"]
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == name]
    annotations = account["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == set(job["metadata"]["annotations"]["helm.sh/hook"].split(","))
    assert _hook_weight(account) < _hook_weight(job)
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    assert account["automountServiceAccountToken"] is False
    # The serving pods keep the release's ordinary ServiceAccount.
    serving = deploy.find(docs, "ServiceAccount", "rel-embedder")
    assert "annotations" not in serving["metadata"] or "helm.sh/hook" not in serving["metadata"]["annotations"]
    assert deploy.pod_spec(deploy.find(docs, "Deployment"))["serviceAccountName"] == "rel-embedder"
    # A ServiceAccount you manage is used as is, and the chart renders none.
    docs = deploy.render("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=mine")
    assert not [d for d in docs if d["kind"] == "ServiceAccount"]
    assert deploy.pod_spec(deploy.find(docs, "Job", "-gate"))["serviceAccountName"] == "mine"
    assert not [d for d in deploy.render("--set", "gate.enabled=false") if d["metadata"]["name"].endswith("-gate")]


def _admits_pod_of_the_namespace(peer: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a NetworkPolicy `from` entry admits a pod of the policy's own namespace with these labels."""
    if set(peer) != {"podSelector"}:
        return False  # ipBlock, or a namespaceSelector (the release's namespace is not assumed to match it)
    selector = peer["podSelector"]
    assert not selector.get("matchExpressions"), "extend the test for matchExpressions"
    return selector.get("matchLabels", {}).items() <= labels.items()


def test_helm_test_pod_reaches_the_http_port_under_the_production_policy(deploy) -> None:
    docs = deploy.render_production()
    labels = deploy.pod_labels(deploy.find(docs, "Pod", "-test-embeddings"))
    (http_rule,) = [
        rule for rule in deploy.find(docs, "NetworkPolicy")["spec"]["ingress"]
        if {"port": "http", "protocol": "TCP"} in rule["ports"]
    ]  # fmt: skip
    assert any(_admits_pod_of_the_namespace(peer, labels) for peer in http_rule["from"])
    # Only the test pod is let in: not the release's other pods, and not other releases' test pods.
    assert not _admits_pod_of_the_namespace(http_rule["from"][-1], deploy.pod_labels(deploy.find(docs, "Deployment")))
    assert not _admits_pod_of_the_namespace(http_rule["from"][-1], {**labels, "app.kubernetes.io/instance": "other"})
    # Without the test pod the policy admits just the configured peers.
    docs = deploy.render_production("--set", "tests.enabled=false")
    (http_rule,) = [r for r in deploy.find(docs, "NetworkPolicy")["spec"]["ingress"] if r["ports"][0]["port"] == "http"]
    assert http_rule["from"] == deploy.values(production=True)["networkPolicy"]["ingressFrom"]


SERVICE_NAMES = [
    "rel-embedder", "rel-embedder.embedder", "rel-embedder.embedder.svc", "rel-embedder.embedder.svc.cluster.local",
]  # fmt: skip


def test_allowed_hosts_keep_the_service_names_callable(deploy) -> None:
    """The server answers 400 to a Host outside a non-empty allowed_hosts: the Service's names must stay in it."""
    from service.guard import host_name
    from service.settings import ServiceSettings

    docs = deploy.render("--set", "config.allowed_hosts={embed.example.com}")
    value = deploy.find(docs, "ConfigMap")["data"]["EMBED_ALLOWED_HOSTS"]
    assert value.split(",") == ["embed.example.com", *SERVICE_NAMES]
    names = ServiceSettings(host="0.0.0.0", allowed_hosts=value).host_names()
    assert names is not None and "evil.example" not in names
    # `helm test` and the NOTES call http://rel-embedder:80 and http://rel-embedder.embedder.svc:80.
    for header in (b"rel-embedder:80", b"rel-embedder.embedder.svc:80", b"embed.example.com"):
        assert host_name(header) in names
    # A name listed twice is written once; empty keeps the server's default (any name while bound to 0.0.0.0).
    docs = deploy.render("--set", "config.allowed_hosts={rel-embedder,embed.example.com}")
    assert deploy.find(docs, "ConfigMap")["data"]["EMBED_ALLOWED_HOSTS"].split(",") == [
        "rel-embedder", "embed.example.com", *SERVICE_NAMES[1:],
    ]  # fmt: skip
    assert deploy.find(deploy.render(), "ConfigMap")["data"]["EMBED_ALLOWED_HOSTS"] == ""


def _refused(deploy, *values: str) -> str:
    """stderr of a render the chart must refuse."""
    result = deploy.run([deploy.tool("bin/helm"), "template", deploy.release, deploy.chart, *values])
    assert result.returncode != 0, f"{values} rendered"
    return result.stderr


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "localhost", "LocalHost", "::1", "[::1]"])
def test_a_loopback_bind_address_is_refused(deploy, host: str) -> None:
    """Bound to the pod's loopback the server is out of reach of the probes and the Service: no pod gets ready."""
    assert "pods must bind 0.0.0.0 (or ::)" in _refused(deploy, "--set-string", f"config.host={host}")


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_the_wildcard_bind_addresses_render(deploy, host: str) -> None:
    docs = deploy.render("--set-string", f"config.host={host}")
    assert deploy.find(docs, "ConfigMap")["data"]["EMBED_HOST"] == host


def test_port_zero_is_refused_by_the_schema(deploy) -> None:
    """The server's 0 = any free port: the pod's containerPort, probes and Service would name no real port."""
    assert "/config/port" in _refused(deploy, "--set", "config.port=0")
    assert deploy.find(deploy.render("--set", "config.port=8000"), "ConfigMap")["data"]["EMBED_PORT"] == "8000"


def test_metrics_port_equal_to_the_http_port_is_refused(deploy) -> None:
    stderr = _refused(deploy, "--set", "config.metrics_port=8080")
    assert "config.metrics_port=8080 is config.port too" in stderr
    assert "config.metrics_port=8000 is config.port too" in _refused(
        deploy, "--set", "config.port=8000", "--set", "config.metrics_port=8000"
    )
    # 0 keeps /metrics on the HTTP port: one port, nothing to clash.
    deployment = deploy.find(deploy.render("--set", "config.metrics_port=0"), "Deployment")
    (container,) = deploy.pod_spec(deployment)["containers"]
    assert [p["containerPort"] for p in container["ports"]] == [8080]


def test_min_replicas_above_max_replicas_is_refused(deploy) -> None:
    assert "autoscaling.minReplicas=8 is above autoscaling.maxReplicas=6" in _refused(
        deploy, "--set", "autoscaling.minReplicas=8"
    )
    hpa = deploy.find(deploy.render("--set", "autoscaling.minReplicas=6"), "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == hpa["spec"]["maxReplicas"] == 6
    # Without the HPA the bounds are unused.
    deploy.render("--set", "autoscaling.enabled=false", "--set", "autoscaling.minReplicas=8")


def _notes(deploy, *values: str) -> str:
    helm = deploy.tool("bin/helm")
    install = [helm, "install", deploy.release, deploy.chart, "-n", deploy.namespace, "--dry-run=client", *values]
    result = deploy.run(install)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


@pytest.mark.parametrize("keys", [["--set", "auth.apiKeys={k1}"], ["--set", "auth.existingSecret=mine"]])
def test_notes_send_the_key_from_the_port_forward_too(deploy, keys: list[str]) -> None:
    """With client keys set, /v1/models without one is answered 401: every curl in the NOTES sends one."""
    curls = [line for line in _notes(deploy, *keys).splitlines() if "curl -s http" in line]
    assert [c.split()[2] for c in curls] == ["http://rel-embedder.embedder.svc:80/v1/embeddings",
                                              "http://127.0.0.1:8080/v1/models"]  # fmt: skip
    assert 'curl -s http://127.0.0.1:8080/v1/models -H "Authorization: Bearer $EMBED_API_KEY"' in curls[1]
    assert "Authorization" not in _notes(deploy)


def test_pods_keep_serving_while_the_service_stops_routing_to_them(deploy) -> None:
    """On SIGTERM the server answers 503 at once: a preStop sleep comes first, inside the termination grace."""
    dockerfile = deploy.dockerfile.read_text()
    assert "ARG BASE=python:3.11.7-slim-bookworm" in dockerfile  # Debian: coreutils' sleep is in the image
    for production in (False, True):
        docs = deploy.render_production() if production else deploy.render()
        values = deploy.values(production=production)
        spec = deploy.pod_spec(deploy.find(docs, "Deployment"))
        (container,) = spec["containers"]
        sleep = values["preStopSleepSeconds"]
        assert sleep >= 5
        assert container["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", str(sleep)]}}
        assert spec["terminationGracePeriodSeconds"] > sleep + values["config"]["shutdown_grace_seconds"]
    stderr = _refused(deploy, "--set", "terminationGracePeriodSeconds=15")
    assert "must exceed preStopSleepSeconds (5) + config.shutdown_grace_seconds (10)" in stderr
    docs = deploy.render("--set", "preStopSleepSeconds=0", "--set", "terminationGracePeriodSeconds=11")
    (container,) = deploy.pod_spec(deploy.find(docs, "Deployment"))["containers"]
    assert "lifecycle" not in container


def _healthcheck_argv(deploy) -> list[str]:
    """The Dockerfile's HEALTHCHECK command (exec form)."""
    text = deploy.dockerfile.read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("HEALTHCHECK")]
    return json.loads(line.split(" CMD ", 1)[1])


def test_image_healthcheck_calls_the_port_of_embed_port(deploy) -> None:
    """`docker run -e EMBED_PORT=...` moves the server: the HEALTHCHECK must follow it (8080 when unset)."""
    argv = _healthcheck_argv(deploy)
    assert argv[:2] == ["python", "-c"]
    code = argv[2]
    assert "EMBED_PORT" in code and "'8080'" in code and "/health" in code

    seen: list[str] = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        env = {**os.environ, "EMBED_PORT": str(port)}
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        assert seen == ["/health"]
    finally:
        server.shutdown()
        server.server_close()


def test_a_volume_without_read_write_many_is_refused_for_several_pods(deploy) -> None:
    """A ReadWriteOnce volume attaches to one node: pods scheduled elsewhere never start (Multi-Attach errors)."""
    rwo = ("--set", "persistence.accessModes={ReadWriteOnce}")
    fixed = ("--set", "autoscaling.enabled=false")
    stderr = _refused(deploy, *fixed, "--set", "replicaCount=3", *rwo)
    assert "up to 3 serving pods mount the claim: set persistence.accessModes={ReadWriteMany}" in stderr
    assert "up to 6 serving pods" in _refused(deploy, *rwo)  # the HPA's maxReplicas
    assert "and the adapt worker Jobs" in _refused(
        deploy, *fixed, "--set", "replicaCount=1", *rwo, "--set", "adaptWorker.enabled=true",
        "--set", "config.adapt_supervise_worker=false", "--set", "adaptStore.url=postgresql://u:p@db:5432/d",
    )  # fmt: skip
    # One pod on a ReadWriteOnce claim works, and so do several on ReadWriteMany.
    docs = deploy.render(*fixed, "--set", "replicaCount=1", *rwo)
    assert deploy.find(docs, "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteOnce"]
    docs = deploy.render(*fixed, "--set", "replicaCount=3", "--set", "persistence.accessModes={ReadWriteMany}")
    assert deploy.find(docs, "Deployment")["spec"]["replicas"] == 3


def test_adapt_without_any_worker_is_refused(deploy) -> None:
    """With /adapt on, jobs need a worker: supervised by the serving pods or run as the ScaledJob's Jobs."""
    stderr = _refused(deploy, "--set", "config.adapt_supervise_worker=false")
    assert "/adapt jobs with no worker" in stderr
    assert "set adaptWorker.enabled=true" in stderr
    # /adapt off needs no worker; the ScaledJob is one.
    docs = deploy.render("--set", "config.adapt_supervise_worker=false", "--set", "config.adapt_enabled=false")
    assert not [d for d in docs if d["kind"] == "ScaledJob"]
    docs = deploy.render(
        "--set", "config.adapt_supervise_worker=false", "--set", "adaptWorker.enabled=true",
        "--set", "adaptStore.url=postgresql://u:p@db:5432/d",
    )  # fmt: skip
    assert deploy.find(docs, "ScaledJob", "-adapt-worker")


@pytest.mark.parametrize(
    "values",
    [
        ["--set", "autoscaling.enabled=false", "--set", "replicaCount=1"],
        ["--set", "autoscaling.minReplicas=1"],
        ["--set", "autoscaling.enabled=false", "--set", "podDisruptionBudget.minAvailable=2"],
        ["--set", "podDisruptionBudget.minAvailable=100%"],
    ],
)
def test_the_disruption_budget_never_blocks_every_drain(deploy, values: list[str]) -> None:
    """minAvailable not below the fewest replicas lets no eviction through: one pod may go at a time instead."""
    spec = deploy.find(deploy.render(*values), "PodDisruptionBudget")["spec"]
    assert spec["maxUnavailable"] == 1
    assert "minAvailable" not in spec


def test_the_disruption_budget_keeps_min_available_when_pods_remain(deploy) -> None:
    assert deploy.find(deploy.render(), "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    spec = deploy.find(deploy.render_production(), "PodDisruptionBudget")["spec"]
    assert spec["minAvailable"] == deploy.values(production=True)["podDisruptionBudget"]["minAvailable"]
    docs = deploy.render("--set", "podDisruptionBudget.minAvailable=50%")
    assert deploy.find(docs, "PodDisruptionBudget")["spec"] == {
        "minAvailable": "50%", "selector": deploy.find(docs, "Deployment")["spec"]["selector"],
    }  # fmt: skip


def test_the_adapt_worker_deadline_fits_the_base_student_build(deploy) -> None:
    """A worker Job stopped at its deadline hands its job back and the next Job starts it from scratch: the longest
    job, the one-time base-student build (its measured seconds on 2 cores in docs/ADAPT.md, plus the teacher's
    pass), must finish well inside the deadline or it never finishes."""
    adapt_doc = (deploy.repo / "docs" / "ADAPT.md").read_text()
    build_seconds = [int(s.replace(",", "")) for s in re.findall(r"(\d,\d{3}) s on a [\w ]*?2-core", adapt_doc)]
    assert len(build_seconds) == 2, build_seconds
    docs = deploy.render(
        "--set", "config.adapt_supervise_worker=false", "--set", "adaptWorker.enabled=true",
        "--set", "adaptStore.url=postgresql://u:p@db:5432/d",
    )  # fmt: skip
    deadline = deploy.find(docs, "ScaledJob", "-adapt-worker")["spec"]["jobTargetRef"]["activeDeadlineSeconds"]
    assert deadline == deploy.values()["adaptWorker"]["activeDeadlineSeconds"] == 10800
    assert deadline >= 3 * max(build_seconds)
    assert "| 10, 10800, 60, 2 CPU" in (deploy.repo / "docs" / "DEPLOY.md").read_text()


def test_state_folders_off_the_volume_are_refused(deploy) -> None:
    """The registry and the adapt job folder live on the shared volume: moved without them, the pods would write
    them outside it (refused by the read-only root, or lost with the pod under /tmp), and replicas share nothing."""
    moved = ("--set", "persistence.mountPath=/data")
    assert (
        "config.registry_dir=/var/lib/embedder/registry is not on the shared volume mounted at "
        "persistence.mountPath=/data" in _refused(deploy, *moved)
    )
    stderr = _refused(deploy, *moved, "--set", "config.registry_dir=/data/registry")
    assert "config.adapt_dir=/var/lib/embedder/adapt-jobs is not on the shared volume" in stderr
    assert "Set config.adapt_dir to a folder under /data (e.g. /data/adapt-jobs)" in stderr
    # A folder beside the mount (a common prefix is not enough), and one on the pod's own /tmp.
    assert "config.registry_dir=/var/lib/embedder-b/registry is not on" in _refused(
        deploy, "--set", "config.registry_dir=/var/lib/embedder-b/registry"
    )
    assert "config.adapt_dir=/tmp/adapt-jobs is not on" in _refused(deploy, "--set", "config.adapt_dir=/tmp/adapt-jobs")
    # With /adapt off and no worker Jobs nothing uses config.adapt_dir.
    deploy.render(*moved, "--set", "config.registry_dir=/data/registry", "--set", "config.adapt_enabled=false")
    # Moved together, every pod mounts the volume where the settings point (trailing slashes and dots are alike).
    docs = deploy.render(
        "--set", "persistence.mountPath=/data/", "--set", "config.registry_dir=/data/./registry",
        "--set", "config.adapt_dir=/data/adapt-jobs/",
    )  # fmt: skip
    env = deploy.find(docs, "ConfigMap")["data"]
    spec = deploy.pod_spec(deploy.find(docs, "Deployment"))
    for container in spec["containers"] + spec["initContainers"]:
        (mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "data"]
        for name in ("EMBED_REGISTRY_DIR", "EMBED_ADAPT_DIR"):
            assert os.path.normpath(env[name]).startswith(os.path.normpath(mount) + "/"), (container["name"], name)


def test_a_volume_over_the_images_own_bundles_is_refused(deploy) -> None:
    """Mounted over seedRegistry.path, the volume hides the bundles the seed copy and the default gate read."""
    onto = ("--set", "persistence.mountPath=/opt/embedder", "--set", "config.registry_dir=/opt/embedder/shared",
            "--set", "config.adapt_dir=/opt/embedder/adapt-jobs")  # fmt: skip
    stderr = _refused(deploy, *onto)
    assert "persistence.mountPath=/opt/embedder covers seedRegistry.path=/opt/embedder/registry" in stderr
    assert "the seed-registry init container copies nothing" in stderr
    no_seed = ("--set", "seedRegistry.enabled=false")
    assert "the gate (gate.candidate empty) finds no bundle" in _refused(
        deploy, *onto, *no_seed, "--set", "persistence.existingClaim=mine"
    )
    # Nothing reads the image's bundles under the mount: no seed copy, and the gate without the volume.
    deploy.render(*onto, *no_seed)
