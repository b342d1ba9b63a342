"""The offline deployment checks CI runs: helm lint and template, kubernetes-validate, checkov, hadolint.

Each check also has a test that it can fail (a broken input is rejected), so a tool that silently stopped
checking would be noticed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

# Checks skipped for every render, with why. Everything else checkov knows must pass.
CHECKOV_SKIPS = {
    # With a fixed tag or a digest IfNotPresent pulls exactly the same image; Always makes every pod start
    # depend on the registry being reachable (air-gapped clusters) for no gain.
    "CKV_K8S_15": "imagePullPolicy IfNotPresent is safe with fixed tags and digests",
}
# Failures accepted in the default render only: its image has no digest (unknown before the image is built).
# values-production.yaml sets image.digest, and there the same check must pass.
DEFAULT_RENDER_ONLY = {"CKV_K8S_43"}


@pytest.mark.parametrize("production", [False, True], ids=["default", "production"])
def test_helm_lint_strict(deploy, production: bool) -> None:
    extra = ["-f", str(deploy.production_values)] if production else []
    result = deploy.run([deploy.tool("bin/helm"), "lint", "--strict", deploy.chart, *extra])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("flag", "value", "complaint"),
    [
        ("--set", "image.tag=latest", "/image/tag"),
        ("--set", "image.tag=", "/image/tag"),
        ("--set", "config.port=http", "/config/port"),
        ("--set", "config.log_level=verbose", "/config/log_level"),
        ("--set", "config.max_batch_size=0", "/config/max_batch_size"),
        ("--set", "config.registry_dir=relative/registry", "/config/registry_dir"),
        ("--set", "config.not_a_setting=1", "not_a_setting"),
        ("--set-json", 'gate.maxDrop="one"', "/gate/maxDrop"),
        ("--set", "image.digest=sha256:abc", "/image/digest"),
    ],
)
def test_helm_lint_rejects_bad_values(deploy, flag: str, value: str, complaint: str) -> None:
    result = deploy.run([deploy.tool("bin/helm"), "lint", "--strict", deploy.chart, flag, value])
    assert result.returncode != 0, f"helm lint accepted {value}"
    assert complaint in result.stdout + result.stderr


@pytest.fixture(scope="module")
def rendered(deploy, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The default and production renders written to files, plus a copy of the Dockerfile, for the tools."""
    folder = tmp_path_factory.mktemp("rendered")
    files = {
        "default": folder / "default.yaml",
        "production": folder / "production.yaml",
    }
    files["default"].write_text(deploy.render_text())
    files["production"].write_text(deploy.render_text("-f", str(deploy.production_values)))
    shutil.copy(deploy.dockerfile, folder / "Dockerfile")
    return files


def test_renders_hold_every_object(deploy, rendered: dict[str, Path]) -> None:
    kinds = set(re.findall(r"^kind: (\w+)$", rendered["production"].read_text(), re.M))
    assert kinds == {
        "ServiceAccount", "ConfigMap", "PersistentVolumeClaim", "Service", "Deployment", "HorizontalPodAutoscaler",
        "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "ScaledJob", "TriggerAuthentication", "Job", "Pod",
    }  # fmt: skip
    assert "kind: Secret" in rendered["default"].read_text()


@pytest.mark.parametrize("which", ["default", "production"])
def test_kubernetes_validate_strict(deploy, rendered: dict[str, Path], which: str) -> None:
    tool = deploy.tool("venv/bin/kubernetes-validate")
    result = deploy.run([tool, "--strict", "-k", "1.32.0", rendered[which]])
    assert result.returncode == 0, result.stdout + result.stderr
    passed = re.findall(r"^INFO .* passed for resource (\S+)", result.stdout, re.M)
    assert len(passed) >= 10, result.stdout
    # The only objects without a bundled schema are custom resources: the ServiceMonitor (checked in test_chart)
    # and KEDA's (checked against KEDA's CRD schemas below).
    warned = re.findall(r"Couldn't find schema for kind (\w+)", result.stdout + result.stderr)
    assert set(warned) <= {"ServiceMonitor", "ScaledJob", "TriggerAuthentication"}


def _keda(deploy, docs: list[dict]) -> subprocess.CompletedProcess[str]:
    """KEDA's objects checked against KEDA's CRD schemas (@kubernetes-models/keda, in tools/keda)."""
    keda_root = deploy.folder("keda/node_modules/@kubernetes-models/keda").parents[2]
    objects = [d for d in docs if d["apiVersion"].startswith("keda.sh/")]
    script = deploy.repo / "tests" / "deploy" / "keda_validate.mjs"
    return subprocess.run(["node", str(script), str(keda_root)], input=json.dumps(objects), capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_keda_objects_match_kedas_crd_schemas(deploy) -> None:
    result = _keda(deploy, deploy.render_production())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == ["ok", "ScaledJob/rel-embedder-adapt-worker",
                                     "ok", "TriggerAuthentication/rel-embedder-adapt-store"]  # fmt: skip


def test_keda_schema_check_catches_a_bad_field(deploy) -> None:
    docs = deploy.render_production()
    scaled = next(d for d in docs if d["kind"] == "ScaledJob")
    scaled["spec"]["maxReplicaCount"] = "four"
    del scaled["spec"]["jobTargetRef"]["template"]
    result = _keda(deploy, docs)
    assert result.returncode != 0
    assert "maxReplicaCount must be integer" in result.stdout and "template" in result.stdout


def test_kubernetes_validate_catches_a_typo(deploy, rendered: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(rendered["default"].read_text().replace("readOnlyRootFilesystem:", "readOnlyRootFileSystem:", 1))
    result = deploy.run([deploy.tool("venv/bin/kubernetes-validate"), "--strict", "-k", "1.32.0", broken])
    assert result.returncode != 0
    assert "readOnlyRootFileSystem" in result.stdout + result.stderr


@pytest.fixture(scope="module")
def checkov_failures(deploy, rendered: dict[str, Path]) -> dict[str, set[str]]:
    """One checkov run (its start-up dominates) over both renders, the Dockerfile and a deliberately broken
    copy of the production render: file name -> failed check ids."""
    folder = rendered["default"].parent
    text = rendered["production"].read_text().replace("privileged: false", "privileged: true", 1)
    (folder / "privileged.yaml").write_text(text)
    tool = deploy.tool("venv/bin/checkov")
    cmd = [tool, "-d", folder, "--framework", "kubernetes", "dockerfile", "--skip-download", "-o", "json", "--quiet"]
    result = deploy.run([*cmd, "--skip-check", ",".join(CHECKOV_SKIPS)], timeout=240)
    reports = json.loads(result.stdout)
    failures: dict[str, set[str]] = {}
    for report in reports if isinstance(reports, list) else [reports]:
        for failed in report["results"]["failed_checks"]:
            failures.setdefault(Path(failed["file_path"]).name, set()).add(failed["check_id"])
    return failures


def test_checkov_kubernetes_and_dockerfile(checkov_failures: dict[str, set[str]]) -> None:
    assert not checkov_failures.get("production.yaml"), checkov_failures
    assert not checkov_failures.get("Dockerfile"), checkov_failures
    # The one accepted failure is real (the default render has no digest), which also shows checkov ran.
    assert checkov_failures.get("default.yaml") == DEFAULT_RENDER_ONLY, checkov_failures


def test_checkov_flags_a_privileged_container(checkov_failures: dict[str, set[str]]) -> None:
    assert "CKV_K8S_16" in checkov_failures.get("privileged.yaml", set())


def test_hadolint_passes_at_warning_threshold(deploy) -> None:
    result = deploy.run([deploy.tool("bin/hadolint"), "--failure-threshold", "warning", deploy.dockerfile])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_flags_an_unpinned_apt_install(deploy, tmp_path: Path) -> None:
    broken = tmp_path / "Dockerfile"
    broken.write_text(deploy.dockerfile.read_text() + "USER root\nRUN apt-get update && apt-get install -y curl\n")
    result = deploy.run([deploy.tool("bin/hadolint"), "--failure-threshold", "warning", broken])
    assert result.returncode != 0
    assert "DL3008" in result.stdout


# --- Dockerfile properties the linters do not check ---------------------------------------------------


@pytest.fixture(scope="module")
def dockerfile(deploy) -> str:
    return deploy.dockerfile.read_text()


def test_base_image_is_a_fixed_tag(dockerfile: str) -> None:
    # Stands in for checkov's CKV_DOCKER_7, which cannot resolve ${BASE} (skipped in the Dockerfile).
    base = re.search(r"^ARG BASE=(\S+)$", dockerfile, re.M)
    assert base, "the Dockerfile must take its base image as `ARG BASE=image:tag`"
    name, _, tag = base.group(1).rpartition(":")
    assert name and tag and tag != "latest", f"BASE={base.group(1)} needs a fixed tag"
    assert re.findall(r"^FROM (\S+)", dockerfile, re.M) == ["${BASE}", "${BASE}"]


def test_runtime_stage_is_non_root_with_healthcheck_and_exec_form(dockerfile: str) -> None:
    runtime = dockerfile.split("AS runtime", 1)[1]
    assert re.search(r"^USER \d+:\d+$", runtime, re.M), "the runtime stage must run as a numeric non-root UID"
    assert "HEALTHCHECK" in runtime and "/health" in runtime.split("HEALTHCHECK", 1)[1].splitlines()[1]
    for instruction in ("ENTRYPOINT", "CMD"):
        line = re.search(rf"^{instruction} (.+)$", runtime, re.M)
        assert line and json.loads(line.group(1)), f"{instruction} must be exec form (a JSON list)"
    assert re.search(r"^EXPOSE 8080$", runtime, re.M)


def test_torch_is_pinned_and_installed_before_the_project(dockerfile: str) -> None:
    torch = dockerfile.index("pip install --no-cache-dir torch==2.13.0")
    project = dockerfile.index("pip install --no-cache-dir -c constraints.txt .")
    assert torch < project
    assert "embedder models prepare" in dockerfile  # the default bundle is built into the image


def test_dockerignore_keeps_local_state_out(deploy, dockerfile: str) -> None:
    entries = [line for line in (deploy.repo / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert entries[0] == "*", "start from nothing and allow-list what the Dockerfile copies"
    allowed = {e.removeprefix("!").rstrip("/") for e in entries[1:] if e.startswith("!")}
    sources = [
        src.rstrip("/") for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile, re.M) for src in line.split()[:-1]
    ]
    assert sources and set(sources) <= allowed, f"COPY sources not allowed by .dockerignore: {set(sources) - allowed}"
    assert not {".venv", "tools", "registry", ".git"} & allowed
