"""`embedder validate`, `layers` and `bench` end to end on tiny models (fast mode)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from embedder.cli import main as embedder_main
from embedder.evaluation_cli import bench_main, layers_main, validate_main

PNG = b"\x89PNG\r\n\x1a\n"


def _is_png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


def test_validate_fails_on_a_drop_and_lists_the_tasks(
    tiny_bert_path: Path, minilm_l3_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A random 32-d model against a trained one: retrieval must drop far more than 1 point.
    args = [str(tiny_bert_path), "--baseline", str(minilm_l3_path), "--tasks", "LeeDocSTS", "ACLSumRetrieval"]
    args += [
        "--layer-tasks",
        "LeeDocSTS",
        "--no-speed",
        "--no-diagnostics",
        "--fast",
        "--quiet",
        "--out",
        str(tmp_path),
    ]
    assert validate_main(args) == 1
    captured = capsys.readouterr()
    assert "ACLSumRetrieval" in captured.err.splitlines()[-1]
    assert "FAIL" in captured.out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["gate"]["passed"] is False
    assert set(report["candidate"]["scores"]) == {"LeeDocSTS", "ACLSumRetrieval"}
    assert len(report["candidate"]["layers"]["LeeDocSTS"]) == 5  # embeddings + 4 layers
    assert len(report["baseline"]["layers"]["LeeDocSTS"]) == 4
    assert "diagnostics" not in report["candidate"]
    markdown = (tmp_path / "report.md").read_text()
    assert "| ACLSumRetrieval |" in markdown and "**FAILED**" in markdown
    assert _is_png(tmp_path / "tasks.png") and _is_png(tmp_path / "layers.png")


def test_validate_passes_against_itself_with_speed_and_reuses_cached_results(
    tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(tiny_bert_path), "--baseline", str(tiny_bert_path), "--tasks", "LeeDocSTS", "BBCNewsKNN"]
    args += ["--min-speedup", "0.01", "--fast", "--quiet", "--out", str(tmp_path)]
    assert validate_main(args) == 0
    assert "PASSED" in capsys.readouterr().out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["baseline"]["tasks"]["LeeDocSTS"]["cached"] is True  # same hash as the candidate
    settings = {row["setting"] for row in report["candidate"]["speed"]["settings"]}
    assert settings == {"short/b1", "short/b32", "long/b1", "long/b32"}
    assert all(row["texts_per_s"] > 0 and row["p50_ms"] > 0 for row in report["candidate"]["speed"]["settings"])
    assert _is_png(tmp_path / "speed.png")
    diagnostics = report["candidate"]["diagnostics"]
    assert diagnostics["bbc_effective_rank"] >= 1.0 and 0 <= diagnostics["bbc_knn10_cosine_9to1"] <= 100
    assert 0 <= diagnostics["crop_alignment_a2"] <= 4


def test_validate_does_not_pass_on_tasks_neither_model_scored(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from core import reference_corpora

    monkeypatch.setitem(sys.modules, "mimesis", None)  # FoodKindClustering's data package cannot be found
    reference_corpora.food_names.cache_clear()
    args = [str(tiny_bert_path), "--baseline", str(tiny_bert_path), "--tasks", "FoodKindClustering", "--fast"]
    args += ["--layer-tasks", "--no-speed", "--no-diagnostics", "--quiet", "--out", str(tmp_path / "gate")]
    assert validate_main(args) == 2
    captured = capsys.readouterr()
    assert "PASSED" not in captured.out
    row = next(line for line in captured.out.splitlines() if line.startswith("FoodKindClustering"))
    assert "skipped: the package 'mimesis' is not installed; install it with `pip install mimesis==" in row
    assert captured.err.splitlines()[-1].startswith("not checked: FoodKindClustering")
    gate = json.loads((tmp_path / "gate" / "report.json").read_text())["gate"]
    assert gate["passed"] is False and gate["could_not_check"] is True
    assert "pip install mimesis==" in gate["unchecked"]["FoodKindClustering"]

    # accepted: the gate passes on the tasks it compared — but never on none
    assert validate_main([*args[:-1], str(tmp_path / "none"), "--allow-skipped"]) == 2
    assert "no task was compared" in capsys.readouterr().out
    with_lee = [*args[:4], "LeeDocSTS", *args[4:-1], str(tmp_path / "allowed"), "--allow-skipped"]
    assert validate_main(with_lee) == 0
    out = capsys.readouterr().out
    assert "FoodKindClustering" in out and "PASSED, leaving out 1 task(s) neither model scored" in out
    report = json.loads((tmp_path / "allowed" / "report.json").read_text())
    assert report["allow_skipped"] is True and list(report["gate"]["unchecked"]) == ["FoodKindClustering"]
    assert "FoodKindClustering" in (tmp_path / "allowed" / "report.md").read_text()


def test_validate_argument_errors(tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert validate_main(["no-such-model", "--fast", "--quiet"]) == 2
    assert "neither a built-in model nor an existing model folder" in capsys.readouterr().err
    assert validate_main([str(tiny_bert_path), "--tasks", "STSBenchmark"]) == 2
    assert "unknown task 'STSBenchmark'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        validate_main([str(tiny_bert_path), "--min-speedup", "2"])
    assert exc.value.code == 2
    assert "pass --baseline too" in capsys.readouterr().err
    assert validate_main([str(tiny_bert_path), "--max-drop", "-1"]) == 2
    assert "--max-drop must be a finite number of points >= 0, got -1.0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-drop", "nan"), ("--max-drop", "inf"), ("--min-speedup", "nan"), ("--min-speedup", "inf"),
     ("--min-speedup", "-inf"), ("--min-speedup", "0")],
)  # fmt: skip
def test_validate_refuses_bounds_that_would_pass_everything(
    flag: str, value: str, tiny_bert_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(tiny_bert_path), "--baseline", str(tiny_bert_path), f"{flag}={value}", "--fast", "--quiet"]
    assert validate_main(args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"embedder validate: {flag} must be a finite ")


def test_layers_command(tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert layers_main([str(tiny_bert_path), "--tasks", "LeeDocSTS", "--fast", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("  layer ") == 5 and "<- best" in out
    assert _is_png(tmp_path / "layers.png")
    curves = json.loads((tmp_path / "layers.json").read_text())["curves"]
    assert len(next(iter(curves.values()))["LeeDocSTS"]) == 5


def test_layers_refuses_a_bundle(tiny_registry: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert layers_main([str(tiny_registry / "tiny" / "1"), "--fast", "--quiet"]) == 2
    assert "layer-wise scores need the torch checkpoint" in capsys.readouterr().err


def test_bench_command(tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main([str(tiny_bert_path), "--fast", "--quiet", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("long/b32") == 1
    speed = json.loads((tmp_path / "speed.json").read_text())
    assert len(next(iter(speed.values()))["settings"]) == 4


def test_commands_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    assert embedder_main(["validate", "--list-tasks"]) == 0
    listed = capsys.readouterr().out
    assert "ACLSumRetrieval" in listed and listed.index("AWSServiceRetrieval") < listed.index("HPODefinitionRetrieval")
    assert embedder_main(["--help"]) == 0
    usage = capsys.readouterr().out
    assert all(name in usage for name in ("validate", "layers", "bench"))


def test_bench_rounds_interleave_the_models_and_print_the_speedup(
    tiny_bert_path: Path, tiny_registry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tiny_registry / "tiny" / "1"
    args = [str(tiny_bert_path), str(bundle), "--fast", "--quiet", "--rounds", "2", "--out", str(tmp_path)]
    assert bench_main(args) == 0
    out = capsys.readouterr().out
    speed = json.loads((tmp_path / "speed.json").read_text())
    first, second = speed
    assert all(report["rounds"] == 2 for report in speed.values())
    assert all(row["calls"] == 4 for row in speed[second]["settings"])  # 2 fast calls per setting in each round
    assert out.count("long/b32") == 2 and f"{second}: " in out
    assert f"x {first}'s texts/s (geometric mean over the settings, medians of 2 rounds)" in out


def test_bench_refuses_zero_rounds(tiny_bert_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench_main([str(tiny_bert_path), "--rounds", "0"])


def test_a_model_folder_without_weights_is_refused(
    tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "no-weights"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_bert_path / "config.json").read_text())
    for command in (validate_main, layers_main, bench_main):
        assert command([str(folder), "--fast", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.splitlines()) == 1
        assert err.startswith(f"embedder {command.__name__.removesuffix('_main')}: cannot load model '{folder}': ")


def _bundle_copy(tiny_registry: Path, tmp_path: Path) -> Path:
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_registry / "tiny" / "1", bundle)
    return bundle


def test_a_bundle_whose_graph_cannot_be_read_is_refused_in_one_line(
    tiny_registry: Path, tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _bundle_copy(tiny_registry, tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    for file in manifest["onnx"].values():
        (bundle / file).write_bytes(b"not a protobuf")
    runs = {
        "validate": lambda spec: validate_main([spec, "--baseline", str(tiny_bert_path), "--fast", "--quiet"]),
        "validate --baseline": lambda spec: validate_main([str(tiny_bert_path), "--baseline", spec, "--fast"]),
        "bench": lambda spec: bench_main([spec, "--fast", "--quiet"]),
        "layers": lambda spec: layers_main([spec, "--fast", "--quiet"]),
    }
    for command, run in runs.items():
        assert run(str(bundle)) == 2, command
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.splitlines()) == 1, command
        prefix = f"embedder {command.split()[0]}: cannot load model '{bundle}': "
        assert err.startswith(prefix) and "InvalidProtobuf" in err, command


def _no_scoring(*args: object, **kwargs: object) -> None:
    raise AssertionError("scored although the report could not be written")


def test_an_out_path_that_cannot_hold_the_report_is_refused_before_scoring(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import evaluation.validate

    monkeypatch.setattr(evaluation.validate, "evaluate_model", _no_scoring)
    monkeypatch.setattr(evaluation.validate, "layer_curves", _no_scoring)
    taken = tmp_path / "report.txt"
    taken.write_text("keep me")
    for out in (taken, taken / "sub"):
        for command in (validate_main, layers_main):
            assert command([str(tiny_bert_path), "--fast", "--quiet", "--out", str(out)]) == 2
            err = capsys.readouterr().err
            assert "Traceback" not in err and len(err.splitlines()) == 1
            assert err.startswith(f"embedder {command.__name__.removesuffix('_main')}: ") and str(out) in err
    assert taken.read_text() == "keep me"
    from training.torch_model import load_any

    with pytest.raises(ValueError, match="no report folder for"):
        evaluation.validate.validate(load_any(str(tiny_bert_path)), out_dir=None, cache=None)


def test_no_cache_without_out_writes_the_report_under_the_cache_dir(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EMBED_CACHE_DIR", str(tmp_path / "cache"))
    args = [str(tiny_bert_path), "--tasks", "LeeDocSTS", "--layer-tasks", "--no-speed", "--no-diagnostics"]
    assert validate_main([*args, "--no-cache", "--fast", "--quiet"]) == 0
    written = Path(capsys.readouterr().out.splitlines()[-1].removeprefix("report: "))
    assert written.is_file() and written.parent.parent == tmp_path / "cache" / "reports"
    assert not (tmp_path / "cache" / "evaluation").exists()  # nothing cached: --no-cache


def test_a_bundle_that_lists_no_graph_is_refused_in_one_line(
    tiny_registry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = _bundle_copy(tiny_registry, tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["onnx"] = {}
    manifest.pop("openvino", None)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    for command in (bench_main, validate_main, layers_main):
        assert command([str(bundle), "--fast", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.splitlines()) == 1
        assert err.startswith(f"embedder {command.__name__.removesuffix('_main')}: ") and str(bundle) in err


def test_bench_refuses_an_out_file_before_measuring(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import evaluation.speed

    monkeypatch.setattr(evaluation.speed, "measure_speed", _no_scoring)
    taken = tmp_path / "speed.txt"
    taken.touch()
    assert bench_main([str(tiny_bert_path), "--fast", "--quiet", "--out", str(taken)]) == 2
    assert capsys.readouterr().err.startswith(f"embedder bench: the report folder {taken} is an existing file")


def _help(command, capsys: pytest.CaptureFixture[str]) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        command(["--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_each_command_help_describes_its_own_fast_and_out(capsys: pytest.CaptureFixture[str]) -> None:
    bench = _help(bench_main, capsys)
    assert "documents per task" not in bench and "default: the bundle folder" not in bench  # bench has neither
    assert "--out OUT folder to write speed.json to (default: none" in bench and "2 timed calls per setting" in bench
    layers = _help(layers_main, capsys)
    assert "default: the bundle folder" not in layers  # layers refuses bundles
    assert "--out OUT folder for layers.png and layers.json (default: <cache dir>/reports/" in layers
    validate = _help(validate_main, capsys)
    assert "report folder (default: the bundle folder for a bundle, else <cache dir>/reports/" in validate
