"""Chart tests of install, test and rollout order: hooks find what they need, `helm test` reaches the Service, the
release's own names pass the Host check, and values the pods could not run with are refused at render time."""

from __future__ import annotations

from typing import Any


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
