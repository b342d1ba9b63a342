"""Chart unit tests against `helm template` output: settings cannot drift, the gate gates, replicas share
the registry, probes hit real routes, and every pod keeps the hardened security context."""

from __future__ import annotations

import json
import os
import tempfile
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from adapt_jobs.settings import AdaptSettings
from service.settings import ADAPT_PREFIX, ServiceSettings


def _mentions(annotation: Any, target: type) -> bool:
    """Whether a type annotation is or contains `target` (list[SecretStr], SecretStr | None, Annotated[...])."""
    if annotation is target:
        return True
    return any(_mentions(arg, target) for arg in typing.get_args(annotation))


FLAT_FIELDS = ServiceSettings.flat_fields()  # flat names: adapt_max_steps for the nested adapt.max_steps
SECRET_FIELDS = sorted(name for name, f in FLAT_FIELDS.items() if _mentions(f.annotation, SecretStr))
CONFIG_FIELDS = sorted(name for name in FLAT_FIELDS if name not in SECRET_FIELDS)


def _flat_dump(settings: ServiceSettings) -> dict[str, Any]:
    dumped = settings.model_dump(mode="json", exclude={"api_keys", "admin_api_keys"})
    adapt = dumped.pop("adapt")
    return dumped | {f"{ADAPT_PREFIX}{name}": value for name, value in adapt.items()}


def _field_schemas() -> dict[str, dict[str, Any]]:
    """Each flat setting's JSON schema, from the pydantic models."""
    service = ServiceSettings.model_json_schema()["properties"]
    adapt = AdaptSettings.model_json_schema()["properties"]
    return {name: adapt[name.removeprefix(ADAPT_PREFIX)] if name.startswith(ADAPT_PREFIX) else service[name]
            for name in FLAT_FIELDS}  # fmt: skip


def _env_name(field: str) -> str:
    return "EMBED_" + field.upper()


def test_settings_split_into_config_and_secret() -> None:
    # The split itself: the API keys and the job store's URL (it may hold a password) never land in the ConfigMap.
    assert SECRET_FIELDS == ["adapt_store_url", "admin_api_keys", "api_keys"]
    assert "port" in CONFIG_FIELDS and "registry_dir" in CONFIG_FIELDS


@pytest.mark.parametrize("production", [False, True], ids=["default", "production"])
def test_configmap_keys_are_exactly_the_service_settings(deploy, production: bool) -> None:
    docs = deploy.render_production() if production else deploy.render()
    data = deploy.find(docs, "ConfigMap")["data"]
    expected = {_env_name(f) for f in CONFIG_FIELDS}
    missing, unknown = expected - set(data), set(data) - expected
    assert not missing and not unknown, (
        f"helm/embedder ConfigMap and service.settings.ServiceSettings drifted: missing {sorted(missing)} "
        f"(add them under `config:` in values.yaml and values.schema.json), unknown {sorted(unknown)} "
        "(remove them, or add the field to ServiceSettings)"
    )


def test_values_config_lists_every_field_even_null_ones(deploy) -> None:
    # A null value renders no key; values.yaml must still name every field so none is forgotten.
    assert sorted(deploy.values()["config"]) == CONFIG_FIELDS


def test_secret_keys_are_exactly_the_secret_settings(deploy) -> None:
    secret = deploy.find(deploy.render("--set", "auth.apiKeys={k1,k2}"), "Secret")
    assert set(secret["stringData"]) == {_env_name(f) for f in SECRET_FIELDS}
    assert secret["stringData"]["EMBED_API_KEYS"] == "k1,k2"
    configmap = deploy.find(deploy.render("--set", "auth.apiKeys={k1,k2}"), "ConfigMap")
    assert not any("k1" in value for value in configmap["data"].values())


def test_existing_secret_replaces_the_chart_secret(deploy) -> None:
    docs = deploy.render_production()
    assert not [d for d in docs if d["kind"] == "Secret"]
    container = deploy.pod_spec(deploy.find(docs, "Deployment"))["containers"][0]
    assert {"secretRef": {"name": "embedder-keys"}} in container["envFrom"]


@pytest.mark.parametrize("production", [False, True], ids=["default", "production"])
def test_configmap_values_parse_back_to_the_chart_values(deploy, monkeypatch, production: bool) -> None:
    """The rendered text (lists comma-joined, maps as JSON, big ints without exponent) is what the service
    reads: building ServiceSettings from it must give back every value of the chart."""
    docs = deploy.render_production() if production else deploy.render("--set", "auth.apiKeys={a,b}")
    env = dict(deploy.find(docs, "ConfigMap")["data"])
    env.update({"EMBED_API_KEYS": "a,b", "EMBED_ADMIN_API_KEYS": "", "EMBED_ADAPT_STORE_URL": ""})
    for name in [n for n in os.environ if n.startswith("EMBED_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = ServiceSettings()
    dumped = _flat_dump(settings)
    wanted = deploy.values(production=production)["config"]
    for field, value in wanted.items():
        if value is not None:
            assert dumped[field] == value, f"config.{field}: chart {value!r} reached the service as {dumped[field]!r}"
    assert settings.api_key_values() == ["a", "b"]


def test_big_integers_render_without_exponent(deploy) -> None:
    data = deploy.find(deploy.render("--set", "config.adapt_max_upload_bytes=123456789"), "ConfigMap")["data"]
    assert data["EMBED_ADAPT_MAX_UPLOAD_BYTES"] == "123456789"


def test_values_schema_config_matches_the_settings_schema(deploy) -> None:
    schema = json.loads((deploy.chart / "values.schema.json").read_text())["properties"]["config"]
    assert schema["additionalProperties"] is False
    assert sorted(schema["properties"]) == CONFIG_FIELDS
    model = _field_schemas()
    for field in CONFIG_FIELDS:
        ours, theirs = schema["properties"][field], model[field]
        their_types = sorted(a["type"] for a in theirs["anyOf"]) if "anyOf" in theirs else [theirs["type"]]
        our_types = sorted(ours["type"]) if isinstance(ours["type"], list) else [ours["type"]]
        assert our_types == their_types, f"config.{field}: schema type {our_types} != ServiceSettings {their_types}"
        for bound in ("minimum", "maximum", "exclusiveMinimum", "enum"):
            assert ours.get(bound) == theirs.get(bound), f"config.{field}: {bound} differs from ServiceSettings"


# --- the validation gate --------------------------------------------------------------------------


def test_gate_job_runs_validate_before_install_and_upgrade(deploy) -> None:
    job = deploy.find(deploy.render(), "Job", "-gate")
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "hook-succeeded" in annotations["helm.sh/hook-delete-policy"]
    # One attempt, no restarts: a failed gate must fail the release, not retry into a pass.
    assert job["spec"]["backoffLimit"] == 0
    spec = deploy.pod_spec(job)
    assert spec["restartPolicy"] == "Never"
    (container,) = spec["containers"]
    assert container["args"] == [
        "validate", "/opt/embedder/registry/minilm-l6/current", "--baseline", "minilm-l6", "--max-drop", "1",
        "--out", "/tmp/gate-report",
    ]  # fmt: skip
    # The candidate is the image's own read-only bundle: the report must go to the writable scratch.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "EMBED_REGISTRY_DIR", "value": "/opt/embedder/registry"} in container["env"]


def test_gate_takes_candidate_baseline_and_margin_from_values(deploy) -> None:
    docs = deploy.render(
        "--set", "gate.candidate=/var/lib/embedder/registry/legal/3", "--set", "gate.baseline=minilm-l3",
        "--set-json", "gate.maxDrop=0.5", "--set", "gate.extraArgs={--min-speedup,1.5}",
        "--set", "persistence.existingClaim=shared-registry",
    )  # fmt: skip
    spec = deploy.pod_spec(deploy.find(docs, "Job", "-gate"))
    (container,) = spec["containers"]
    assert container["args"] == [
        "validate", "/var/lib/embedder/registry/legal/3", "--baseline", "minilm-l3", "--max-drop", "0.5",
        "--out", "/tmp/gate-report", "--min-speedup", "1.5",
    ]  # fmt: skip
    # With the shared registry mounted, registry:NAME specs resolve there.
    assert {"name": "EMBED_REGISTRY_DIR", "value": "/var/lib/embedder/registry"} in container["env"]
    assert {"name": "data", "mountPath": "/var/lib/embedder"} in container["volumeMounts"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "shared-registry"}} in spec["volumes"]


def test_gate_reads_nothing_created_by_the_release(deploy) -> None:
    """Pre-install hooks run before the release's ConfigMap, Secret and claim exist."""
    spec = deploy.pod_spec(deploy.find(deploy.render(), "Job", "-gate"))
    text = json.dumps(spec)
    assert "configMapRef" not in text and "secretRef" not in text and "persistentVolumeClaim" not in text


def test_gate_can_be_disabled(deploy) -> None:
    docs = deploy.render("--set", "gate.enabled=false")
    assert not [d for d in docs if d["kind"] == "Job"]


def test_gate_pods_get_no_service_traffic(deploy) -> None:
    docs = deploy.render()
    selector = deploy.find(docs, "Service")["spec"]["selector"]
    for doc in (deploy.find(docs, "Job", "-gate"), deploy.find(docs, "Pod", "-test-embeddings")):
        labels = deploy.pod_labels(doc)
        assert not selector.items() <= labels.items(), f"{doc['metadata']['name']} would receive Service traffic"
    assert selector.items() <= deploy.pod_labels(deploy.find(docs, "Deployment")).items()


# --- shared registry and scaling --------------------------------------------------------------------


def test_replicas_share_one_readwritemany_registry(deploy) -> None:
    docs = deploy.render()
    values = deploy.values()
    pvc = deploy.find(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    spec = deploy.pod_spec(deploy.find(docs, "Deployment"))
    data = next(v for v in spec["volumes"] if v["name"] == "data")
    assert data["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    mount = values["persistence"]["mountPath"]
    for container in spec["containers"] + spec["initContainers"]:
        assert {"name": "data", "mountPath": mount} in container["volumeMounts"]
    # The registry and the adapt job store live on that volume, so every replica sees adapted models.
    for key in ("registry_dir", "adapt_dir"):
        assert Path(values["config"][key]).is_relative_to(mount), f"config.{key} is not on the shared volume"


def test_production_adapt_workers_are_a_keda_scaled_job_on_the_shared_store(deploy) -> None:
    docs = deploy.render_production()
    scaled = deploy.find(docs, "ScaledJob", "-adapt-worker")
    values = deploy.values(production=True)
    # One Kubernetes Job per queued adapt job, at most adapt_max_concurrent_jobs at once; the job store counts
    # attempts, so the Job never restarts its pod.
    assert scaled["spec"]["maxReplicaCount"] == values["config"]["adapt_max_concurrent_jobs"]
    assert scaled["spec"]["jobTargetRef"]["backoffLimit"] == 0
    spec = deploy.pod_spec(scaled)
    assert spec["restartPolicy"] == "Never" and spec["terminationGracePeriodSeconds"] >= 30
    (container,) = spec["containers"]
    assert container["args"] == ["adapt-worker", "--once"]
    # the same settings as the serving pods: the ConfigMap, and of the Secret the store's URL alone
    assert {"configMapRef": {"name": "rel-embedder"}} in container["envFrom"]
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "embedder-keys", "key": "EMBED_ADAPT_STORE_URL"}
    claim = deploy.find(docs, "PersistentVolumeClaim")["metadata"]["name"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": claim}} in spec["volumes"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    auth = deploy.find(docs, "TriggerAuthentication", "-adapt-store")
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "connection", "name": "embedder-keys", "key": "EMBED_ADAPT_STORE_URL"}
    ]
    # With workers outside, the serving pods must not start their own.
    assert deploy.find(docs, "ConfigMap")["data"]["EMBED_ADAPT_SUPERVISE_WORKER"] == "false"


def test_the_scalers_query_counts_the_queued_jobs_of_a_real_store(deploy, postgres) -> None:
    """KEDA runs the trigger's SQL against the job store: run it against a real one. A job waiting for a student
    build counts once the build ended (a worker then runs it, or fails it with reason "dependency")."""
    import psycopg

    from adapt_jobs.store import JobStore

    query = deploy.find(deploy.render_production(), "ScaledJob")["spec"]["triggers"][0]["metadata"]["query"]
    url = postgres.new_database()
    store = JobStore(url)
    for _ in range(3):
        store.create({"base_model": "b", "name": "n"}, corpus_dir="/c", n_documents=1, max_pending=9, max_attempts=2)
    store.claim_next("w", max_running=9, lease_s=30)  # running: no longer waiting for a pod
    build = store.create({"base_model": "b", "name": "b--sct-tiny"}, corpus_dir="/b", n_documents=0, max_pending=9,
                         max_attempts=2, kind="student-build")  # fmt: skip
    store.create({"base_model": "b", "name": "s"}, corpus_dir="/c", n_documents=1, max_pending=9, max_attempts=2,
                 after_job=build.id)  # fmt: skip
    with psycopg.connect(url) as conn:
        assert conn.execute(query).fetchone()[0] == 3  # two adapt jobs and the build; not the job waiting for it
    claimed = [store.claim_next("w", max_running=9, lease_s=30) for _ in range(3)]
    assert claimed[-1].id == build.id and store.claim_next("w", max_running=9, lease_s=30) is None
    store.finish(claimed[-1].lease, "succeeded")
    with psycopg.connect(url) as conn:
        assert conn.execute(query).fetchone()[0] == 1  # the waiting job can run now


def test_the_scalers_query_is_the_stores_ready_rule(deploy) -> None:
    """The chart holds the text `adapt_jobs.store_ready` renders (`python -m adapt_jobs.store_ready` prints it for the
    template), so the scaler and `claim_next` share one definition of a job ready to claim."""
    from adapt_jobs.store_ready import ready_count_sql

    query = deploy.find(deploy.render_production(), "ScaledJob")["spec"]["triggers"][0]["metadata"]["query"]
    assert query == ready_count_sql(), "regenerate the trigger's query with `python -m adapt_jobs.store_ready`"


def test_the_scalers_count_and_claim_next_agree_on_every_combination_of_job_states(deploy, postgres) -> None:
    """Against a real PostgreSQL: a job in every state (a lease lapsed or not), of both kinds, waiting for no job or
    for one in every state. KEDA's count is exactly the jobs `claim_next` then takes: the queued ones waiting for
    nothing or for a job that succeeded."""
    import itertools

    import psycopg
    import sqlalchemy as sa

    from adapt_jobs.jobs import ACTIVE_STATES, ALL_STATES, JOB_KIND_ADAPT, JOB_KIND_STUDENT_BUILD, QUEUED, SUCCEEDED
    from adapt_jobs.store import JobStore
    from adapt_jobs.store_db import jobs_table

    query = deploy.find(deploy.render_production(), "ScaledJob")["spec"]["triggers"][0]["metadata"]["query"]
    url = postgres.new_database()
    store = JobStore(url)
    names = itertools.count()

    def job(state: str, *, lapsed: bool = False, kind: str = JOB_KIND_ADAPT, after: str | None = None) -> str:
        made = store.create({"base_model": "b", "name": f"n-{next(names)}"}, corpus_dir="/nonexistent",
                            n_documents=1, max_pending=10_000, max_attempts=2, kind=kind, after_job=after)  # fmt: skip
        lease = {"worker_id": "w", "lease_expires_at": 0.0 if lapsed else 4e9} if state in ACTIVE_STATES else {}
        with store.engine.begin() as conn:  # the state as it stands, not a transition
            conn.execute(sa.update(jobs_table).where(jobs_table.c.id == made.id).values(state=state, **lease))
        return made.id

    dependencies = {state: job(state, kind=JOB_KIND_STUDENT_BUILD) for state in ALL_STATES}
    expected = {dependencies[QUEUED]}  # the pending build itself is ready
    for state, lapsed, kind, after in itertools.product(
        ALL_STATES, (False, True), (JOB_KIND_ADAPT, JOB_KIND_STUDENT_BUILD), (None, *ALL_STATES)
    ):
        if lapsed and state not in ACTIVE_STATES:
            continue
        job_id = job(state, lapsed=lapsed, kind=kind, after=dependencies[after] if after else None)
        if state == QUEUED and after in (None, SUCCEEDED):
            expected.add(job_id)

    with psycopg.connect(url) as conn:
        count = conn.execute(query).fetchone()[0]
    claimed = set()
    while (next_job := store.claim_next("w2", max_running=10_000, lease_s=30)) is not None:
        claimed.add(next_job.id)
    assert count == len(claimed) and claimed == expected
    with psycopg.connect(url) as conn:
        assert conn.execute(query).fetchone()[0] == 0


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (["--set", "adaptWorker.enabled=true", "--set", "adaptStore.url=postgresql://u:p@db/e"],
         "set config.adapt_supervise_worker=false"),
        (["--set", "adaptWorker.enabled=true", "--set", "config.adapt_supervise_worker=false"],
         "needs the shared PostgreSQL job store"),
    ],
)  # fmt: skip
def test_worker_workload_refuses_a_deployment_that_would_not_work(deploy, values: list[str], complaint: str) -> None:
    result = deploy.run([deploy.tool("bin/helm"), "template", deploy.release, deploy.chart, *values])
    assert result.returncode != 0 and complaint in result.stderr


def test_store_url_goes_to_the_secret_and_sqlite_on_many_replicas_is_flagged(deploy) -> None:
    secret = deploy.find(deploy.render("--set", "adaptStore.url=postgresql://u:pw@db:5432/e"), "Secret")
    assert secret["stringData"]["EMBED_ADAPT_STORE_URL"] == "postgresql://u:pw@db:5432/e"
    configmap = deploy.find(deploy.render("--set", "adaptStore.url=postgresql://u:pw@db:5432/e"), "ConfigMap")
    assert not any("pw" in value for value in configmap["data"].values())
    helm = deploy.tool("bin/helm")
    install = [helm, "install", deploy.release, deploy.chart, "-n", deploy.namespace, "--dry-run=client"]
    notes = deploy.run(install).stdout.split("NOTES:", 1)[1]
    assert "the /adapt job store is SQLite" in notes  # two to six replicas by default
    notes = deploy.run([*install, "--set", "adaptStore.url=postgresql://u:pw@db/e"]).stdout.split("NOTES:", 1)[1]
    assert "SQLite" not in notes


def test_seed_script_never_overwrites_a_model(deploy, tmp_path: Path) -> None:
    """Run the init container's script for real: it copies missing models and leaves existing ones alone."""
    spec = deploy.pod_spec(deploy.find(deploy.render(), "Deployment"))
    script = spec["initContainers"][0]["args"][0]
    seed, registry = tmp_path / "seed", tmp_path / "registry"
    (seed / "minilm-l6" / "1").mkdir(parents=True)
    (seed / "minilm-l6" / "1" / "manifest.json").write_text("{}")
    (seed / "minilm-l6" / "current").symlink_to("1")
    (seed / "other" / "1").mkdir(parents=True)
    (registry / "other" / "7").mkdir(parents=True)
    script = script.replace('"/opt/embedder/registry"', f'"{seed}"').replace('"/var/lib/embedder/registry"',
                                                                            f'"{registry}"')  # fmt: skip
    for _ in range(2):  # the second run (a later pod) finds everything in place
        result = deploy.run(["sh", "-c", script])
        assert result.returncode == 0, result.stderr
    assert (registry / "minilm-l6" / "current").is_symlink()
    assert (registry / "minilm-l6" / "current" / "manifest.json").is_file()
    assert sorted(p.name for p in (registry / "other").iterdir()) == ["7"]
    assert not [p for p in registry.iterdir() if p.name.startswith(".seed-")]


def test_hpa_scales_the_deployment_on_cpu_and_optionally_queue_depth(deploy) -> None:
    hpa = deploy.find(deploy.render(), "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deploy.find(deploy.render(), "Deployment")["metadata"]["name"]
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert "replicas" not in deploy.find(deploy.render(), "Deployment")["spec"]  # the HPA owns the count
    metrics = deploy.find(deploy.render_production(), "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metrics[1]["pods"]["metric"]["name"] == "embed_queue_depth"
    fixed = deploy.render("--set", "autoscaling.enabled=false", "--set", "replicaCount=3")
    assert deploy.find(fixed, "Deployment")["spec"]["replicas"] == 3
    assert "HorizontalPodAutoscaler" not in [d["kind"] for d in fixed]


def test_queue_depth_metric_is_a_gauge_the_service_exports(deploy) -> None:
    from service.metrics import ServiceMetrics

    gauges = {m.name for m in ServiceMetrics().registry.collect() if m.type == "gauge"}
    for production in (False, True):
        name = deploy.values(production=production)["autoscaling"]["queueDepth"]["metricName"]
        assert name in gauges, f"autoscaling.queueDepth.metricName {name!r} is not a gauge of service.metrics"


def test_pdb_selects_the_serving_pods(deploy) -> None:
    docs = deploy.render()
    pdb = deploy.find(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == deploy.find(docs, "Deployment")["spec"]["selector"]["matchLabels"]


# --- routes and probes ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def service_routes() -> dict[str, set[str]]:
    """Path -> HTTP methods of the real FastAPI app (built, not started: no model is loaded)."""
    from service.app import create_app

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        settings = ServiceSettings.from_flat(registry_dir=root / "registry", adapt_dir=root / "adapt", warmup=False)
        app = create_app(settings, backend_factory=lambda bundle, settings: None)
        return {path: {m.upper() for m in ops} for path, ops in app.openapi()["paths"].items()}


def test_probes_point_at_real_routes(deploy, service_routes: dict[str, set[str]]) -> None:
    docs = deploy.render()
    (container,) = deploy.pod_spec(deploy.find(docs, "Deployment"))["containers"]
    probes = {kind: container[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes["livenessProbe"]["path"] == "/health" and probes["readinessProbe"]["path"] == "/ready"
    for probe in probes.values():
        assert "GET" in service_routes[probe["path"]], f"probe path {probe['path']} is not a GET route of the service"
        assert probe["port"] == "http"
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert port == deploy.values()["config"]["port"] == 8080
    assert deploy.find(docs, "Service")["spec"]["ports"][0]["targetPort"] == "http"


def test_helm_test_and_servicemonitor_call_real_routes(deploy, service_routes: dict[str, set[str]]) -> None:
    docs = deploy.render_production()
    monitor = deploy.find(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics" and "GET" in service_routes["/metrics"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"  # its own port (test_chart_security)
    # A ServiceMonitor selects Services by their labels.
    service_labels = deploy.find(docs, "Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    test_pod = deploy.find(docs, "Pod", "-test-embeddings")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = test_pod["spec"]["containers"][0]["args"][0]
    assert "/v1/embeddings" in script and "POST" in service_routes["/v1/embeddings"]
    assert f"http://{deploy.release}-embedder:80/v1/embeddings" in script
    compile(script, "helm-test", "exec")  # the inline client is valid Python


def test_container_runs_serve(deploy) -> None:
    (container,) = deploy.pod_spec(deploy.find(deploy.render(), "Deployment"))["containers"]
    assert container["args"] == ["serve"]
    assert container["image"] == "registry.example.com/embedder:0.1.0"


def test_digest_pins_the_image(deploy) -> None:
    docs = deploy.render_production()
    digest = deploy.values(production=True)["image"]["digest"]
    for doc in docs:
        if doc["kind"] in {"Deployment", "Job", "ScaledJob", "Pod"}:
            spec = deploy.pod_spec(doc)
            for container in spec["containers"] + spec.get("initContainers", []):
                assert container["image"] == f"registry.example.com/ml/embedder@{digest}"


# --- hardening -----------------------------------------------------------------------------------------


def _all_pods(deploy) -> list[dict[str, Any]]:
    return [d for d in deploy.render_production() if d["kind"] in {"Deployment", "Job", "ScaledJob", "Pod"}]


def test_every_container_is_hardened(deploy) -> None:
    pods = _all_pods(deploy)
    assert sorted(d["kind"] for d in pods) == ["Deployment", "Job", "Pod", "ScaledJob"]
    for doc in pods:
        spec = deploy.pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for container in spec["containers"] + spec.get("initContainers", []):
            where = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] >= 10000, where
            assert ctx["capabilities"]["drop"] == ["ALL"], where
            assert {"limits", "requests"} <= set(container["resources"]), where
            # The root filesystem is read-only: /tmp must be a writable volume.
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], where
        tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
        assert "emptyDir" in tmp


@pytest.mark.parametrize(
    ("weakened", "where"),
    [
        ("securityContext.readOnlyRootFilesystem=false", "/securityContext/readOnlyRootFilesystem"),
        ("securityContext.readOnlyRootFilesystem=null", "readOnlyRootFilesystem"),
        ("securityContext.runAsNonRoot=false", "/securityContext/runAsNonRoot"),
        ("securityContext.runAsUser=0", "/securityContext/runAsUser"),
        ("securityContext.runAsGroup=0", "/securityContext/runAsGroup"),
        ("securityContext.allowPrivilegeEscalation=true", "/securityContext/allowPrivilegeEscalation"),
        ("securityContext.privileged=true", "/securityContext/privileged"),
        ("securityContext.capabilities.add={NET_ADMIN}", "/securityContext/capabilities/add"),
        ("securityContext.capabilities.drop={NET_RAW}", "/securityContext/capabilities/drop"),
        ("securityContext.capabilities=null", "capabilities"),
        ("securityContext.seccompProfile.type=Unconfined", "/securityContext/seccompProfile/type"),
        ("securityContext.seccompProfile=null", "seccompProfile"),
        ("securityContext.appArmorProfile.type=Unconfined", "/securityContext/appArmorProfile/type"),
        ("securityContext.procMount=Unmasked", "/securityContext/procMount"),
        ("securityContext.seLinuxOptions.user=system_u", "user"),
        ("securityContext.windowsOptions.hostProcess=true", "windowsOptions"),
        ("podSecurityContext.runAsNonRoot=false", "/podSecurityContext/runAsNonRoot"),
        ("podSecurityContext.runAsUser=0", "/podSecurityContext/runAsUser"),
        ("podSecurityContext.fsGroup=0", "/podSecurityContext/fsGroup"),
        ("podSecurityContext.supplementalGroups={0}", "/podSecurityContext/supplementalGroups/0"),
        ("podSecurityContext.seccompProfile.type=Unconfined", "/podSecurityContext/seccompProfile/type"),
        ("podSecurityContext.seccompProfile=null", "seccompProfile"),
        ("podSecurityContext.sysctls[0].name=kernel.msgmax", "sysctls"),
    ],
)
def test_schema_refuses_weakening_the_security_context(deploy, weakened: str, where: str) -> None:
    """docs/DEPLOY.md promises pods that run as non-root with a read-only root, no escalation, no capabilities and
    the RuntimeDefault seccomp profile: no value may switch any of it off."""
    result = deploy.run([deploy.tool("bin/helm"), "lint", "--strict", deploy.chart, "--set", weakened])
    assert result.returncode != 0, f"{weakened} was accepted"
    assert where in result.stdout + result.stderr


@pytest.mark.parametrize(
    "values",
    [
        ["--set", "securityContext.runAsUser=20000", "--set", "podSecurityContext.runAsUser=20000"],
        # Platforms that assign the UID and GID themselves: leave them out, runAsNonRoot still holds.
        ["--set", "securityContext.runAsUser=null", "--set", "securityContext.runAsGroup=null",
         "--set", "podSecurityContext.runAsUser=null", "--set", "podSecurityContext.runAsGroup=null",
         "--set", "podSecurityContext.fsGroup=null"],
        ["--set", "securityContext.seccompProfile.type=Localhost",
         "--set", "securityContext.seccompProfile.localhostProfile=profiles/embedder.json"],
        ["--set", "securityContext.capabilities.drop={ALL,NET_RAW}"],
    ],
    ids=["other-uid", "uid-from-platform", "localhost-seccomp", "drop-more"],
)  # fmt: skip
def test_schema_lets_the_security_context_be_tightened_or_moved(deploy, values: list[str]) -> None:
    spec = deploy.pod_spec(deploy.find(deploy.render(*values), "Deployment"))
    assert spec["securityContext"]["runAsNonRoot"] is True
    for container in spec["containers"] + spec["initContainers"]:
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
        assert "ALL" in ctx["capabilities"]["drop"] and "add" not in ctx["capabilities"]


def test_network_policy_covers_every_pod_of_the_release(deploy) -> None:
    docs = deploy.render_production()
    policy = deploy.find(docs, "NetworkPolicy")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for doc in docs:
        if doc["kind"] in {"Deployment", "Job", "ScaledJob", "Pod"}:
            assert selector.items() <= deploy.pod_labels(doc).items(), doc["metadata"]["name"]
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert "NetworkPolicy" not in [d["kind"] for d in deploy.render("--set", "networkPolicy.enabled=false")]


def test_notes_tell_how_to_call_the_service(deploy) -> None:
    helm = deploy.tool("bin/helm")
    result = deploy.run([helm, "install", deploy.release, deploy.chart, "-n", deploy.namespace, "--dry-run=client"])
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "http://rel-embedder.embedder.svc:80/v1/embeddings" in notes
    assert "WARNING: no API keys are set" in notes


def test_deploy_doc_describes_every_setting(deploy) -> None:
    doc = (deploy.repo / "docs" / "DEPLOY.md").read_text()
    missing = [f for f in CONFIG_FIELDS if f"`{_env_name(f)}`" not in doc]
    assert not missing, f"docs/DEPLOY.md has no row for {missing}: add them to the `config` table"
