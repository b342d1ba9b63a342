"""report.json is strict JSON and says what was run where: the model's source, each task's revision, the CPU, the
libraries that computed the scores and the date."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mteb

from evaluation.report import write_report
from evaluation.tasks import BBCNewsKNN
from evaluation.validate import REPORT_FORMAT, validate


def _strict(text: str) -> dict:
    return json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(f"not JSON: {name}")))


def test_report_json_is_strict_json_with_null_for_undefined_metrics(fake_model_factory, tmp_path: Path) -> None:
    model = fake_model_factory("m", lambda text: [len(text), text.count("e") + 1.0], dim=2)
    report, _, written = validate(model, tasks=["LeeDocSTS"], fast=True, layer_tasks=(), speed=False,
                                  diagnostics=False, out_dir=tmp_path, progress=False)  # fmt: skip
    # mteb leaves some secondary metrics undefined (a retrieval nAUC when every query finds its document): NaN
    report["candidate"]["tasks"]["LeeDocSTS"]["details"]["nauc_recall_at_1000_max"] = math.nan
    report["candidate"]["tasks"]["LeeDocSTS"]["details"]["overflow"] = math.inf
    written = write_report(report, tmp_path)
    details = _strict(written["report.json"].read_text())["candidate"]["tasks"]["LeeDocSTS"]["details"]
    assert details["nauc_recall_at_1000_max"] is None and details["overflow"] is None
    assert details["cosine_spearman"] == report["candidate"]["tasks"]["LeeDocSTS"]["details"]["cosine_spearman"]


def test_report_names_the_run(tiny_bert_path: Path, tmp_path: Path) -> None:
    from embedder.evaluation_cli import validate_main

    args = [str(tiny_bert_path), "--tasks", "LeeDocSTS", "BBCNewsKNN", "--fast", "--quiet", "--no-speed"]
    assert validate_main([*args, "--layer-tasks", "--no-diagnostics", "--out", str(tmp_path)]) == 0
    report = _strict((tmp_path / "report.json").read_text())
    assert report["format_version"] == REPORT_FORMAT
    assert report["created_at"].endswith("+00:00")
    model = report["candidate"]["model"]
    assert model["source"] == str(tiny_bert_path.resolve())  # the folder, not only its last name
    tasks = report["candidate"]["tasks"]
    assert tasks["LeeDocSTS"]["revision"] == "1" and tasks["BBCNewsKNN"]["revision"] == BBCNewsKNN.revision != "1"
    assert tasks["BBCNewsKNN"]["mteb_version"] == mteb.__version__
    env = report["environment"]
    assert env["cpu"]["model"] and env["cpu_count"] >= 1 and env["python"].count(".") == 2
    assert env["packages"]["mteb"] == mteb.__version__ and env["packages"]["scikit-learn"]
    markdown = (tmp_path / "report.md").read_text()
    assert str(tiny_bert_path.resolve()) in markdown and env["cpu"]["model"] in markdown and "mteb " in markdown


def test_a_bundle_reports_the_folder_it_was_loaded_from(tiny_registry: Path) -> None:
    from evaluation.embedding_model import load_model

    folder = tiny_registry / "tiny" / "1"
    info = load_model(str(folder), variant="fp32").info()
    assert info["source"] == str(folder.resolve()) and info["variant"] == "fp32" and info["engine"]
    # registry:NAME resolves to the version it names now: the report keeps which one that was
    assert load_model("registry:tiny", registry_dir=tiny_registry).info()["source"] == str(folder.resolve())
