"""Shared helpers of the deployment checks: the offline tools from scripts/deploy-tools.sh and chart renders.

A missing tool skips the check on a developer machine but fails it under CI (``CI=true``), so CI can never
pass by silently skipping the Helm, checkov, kubernetes-validate or hadolint checks.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


class Deploy:
    """The repository's deployment files, the check tools, and cached `helm template` renders."""

    repo = REPO
    chart = REPO / "helm" / "embedder"
    production_values = REPO / "helm" / "values-production.yaml"
    dockerfile = REPO / "Dockerfile"
    release = "rel"
    namespace = "embedder"

    def __init__(self) -> None:
        self.tools = Path(os.environ.get("DEPLOY_TOOLS_DIR", REPO / "tools"))
        self._renders: dict[tuple[str, ...], str] = {}

    def tool(self, relative: str) -> Path:
        """A tool under tools/, or skip (fail under CI=true) with the command that installs it."""
        path = self.tools / relative
        if path.is_file() and os.access(path, os.X_OK):
            return path
        self._missing(path)

    def folder(self, relative: str) -> Path:
        """A folder under tools/ (KEDA's schemas), or skip (fail under CI=true) as `tool` does."""
        path = self.tools / relative
        if path.is_dir():
            return path
        self._missing(path)

    @staticmethod
    def _missing(path: Path) -> NoReturn:
        message = f"{path} is missing: run `bash scripts/deploy-tools.sh` to install the deployment check tools"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)

    def run(self, cmd: list[str | Path], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=REPO)

    def render_text(self, *args: str) -> str:
        """`helm template` output (hooks and `helm test` pods included) for extra helm flags."""
        if args not in self._renders:
            result = self.run(
                [self.tool("bin/helm"), "template", self.release, self.chart, "--namespace", self.namespace, *args]
            )
            assert result.returncode == 0, f"helm template {' '.join(args)} failed:\n{result.stderr}"
            self._renders[args] = result.stdout
        return self._renders[args]

    def render(self, *args: str) -> list[dict[str, Any]]:
        """The rendered manifests as dicts, in file order."""
        return [doc for doc in yaml.safe_load_all(self.render_text(*args)) if doc]

    def render_production(self, *args: str) -> list[dict[str, Any]]:
        return self.render("-f", str(self.production_values), *args)

    def values(self, production: bool = False) -> dict[str, Any]:
        """values.yaml, merged with the production file (one level deep, as the tests need) when asked."""
        merged = yaml.safe_load((self.chart / "values.yaml").read_text())
        if production:
            for key, value in yaml.safe_load(self.production_values.read_text()).items():
                if isinstance(value, dict) and isinstance(merged.get(key), dict):
                    merged[key] = {**merged[key], **value}
                else:
                    merged[key] = value
        return merged

    @staticmethod
    def find(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
        matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
        names = [m["metadata"]["name"] for m in matches]
        assert len(matches) == 1, f"expected one {kind} named *{name_suffix}, found {names}"
        return matches[0]

    @staticmethod
    def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
        """The pod spec of a Deployment, Job, KEDA ScaledJob or Pod."""
        if doc["kind"] == "Pod":
            return doc["spec"]
        if doc["kind"] == "ScaledJob":
            return doc["spec"]["jobTargetRef"]["template"]["spec"]
        return doc["spec"]["template"]["spec"]

    @staticmethod
    def pod_labels(doc: dict[str, Any]) -> dict[str, str]:
        if doc["kind"] == "Pod":
            return doc["metadata"]["labels"]
        if doc["kind"] == "ScaledJob":
            return doc["spec"]["jobTargetRef"]["template"]["metadata"]["labels"]
        return doc["spec"]["template"]["metadata"]["labels"]


@pytest.fixture(scope="session")
def deploy() -> Deploy:
    return Deploy()
