"""Export: bundle layout and manifest, ONNX == torch (dynamic axes, truncation, int8), parity
failures that publish nothing, validation hook, concurrent versions."""

from __future__ import annotations

import functools
import json
import multiprocessing
import shutil
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from core import registry, runtime
from core.catalog import sha256_file
from core.engines import load_engine
from core.model_folder import embedding_file_digests
from core.runtime import OnnxBundle, cosines
from evaluation.embedding_model import load_model
from export import bundle as exporter
from export import graph, openvino_int8, quantize
from export.parity import ParityError
from export.probes import probe_texts
from training.encoder import Encoder
from training.students import tiny_bert_student

MANIFEST_KEYS = {
    "name", "version", "created_at", "source", "base_model", "parent", "method", "layers", "source_layers",
    "dim", "pooling", "normalized", "max_seq_length", "pad_token_id", "inputs", "output", "opset",
    "quantization", "int8", "onnx", "serve_variant", "probes", "files", "parity", "validation", "trained_on",
    "openvino", "openvino_int8",
}  # fmt: skip


def torch_reference(path: Path, layers: int | None = None) -> Encoder:
    encoder = Encoder.from_pretrained(path, normalize=True)
    return encoder.truncate(layers) if layers else encoder


def onnx_vs_torch(bundle_dir: Path, encoder: Encoder, texts: list[str], variant: str = "fp32") -> np.ndarray:
    """Cosines of one padded ONNX batch against the same batch in torch (one forward each)."""
    bundle = OnnxBundle(bundle_dir, variant=variant)
    out = bundle.run(bundle.pad(bundle.tokenize(texts)))
    with torch.no_grad():
        ref = encoder(**encoder.tokenize(texts)).numpy()
    assert out.shape == ref.shape == (len(texts), encoder.dim)
    return cosines(out, ref)


def batch_of_17(texts: list[str]) -> list[str]:
    long_text = "tokens " * 400  # far past every max_seq_length here
    return [*texts, long_text, "ok", *[f"sentence number {i} of a padded batch" for i in range(7)]]


# --- a real-weights bundle: minilm-l3, fp32 + int8 ---------------------------------------------


@pytest.fixture(scope="module")
def l3_registry(tmp_path_factory: pytest.TempPathFactory, minilm_l3_path: Path) -> Path:
    root = tmp_path_factory.mktemp("registry")
    exporter.export_bundle(minilm_l3_path, root, "minilm-l3", quantize="int8", promote=True, parent="base@1")
    return root


def test_bundle_layout_and_manifest(l3_registry: Path, minilm_l3_path: Path) -> None:
    bundle = registry.current_bundle(l3_registry, "minilm-l3")
    assert bundle == l3_registry / "minilm-l3" / "1"
    assert registry.served_models(l3_registry) == {"minilm-l3": bundle}
    leftovers = sorted(p.name for p in (l3_registry / "minilm-l3").iterdir())
    assert leftovers == [".lock", "1", "current"]  # the name's lock (core.registry), and nothing half made
    manifest = registry.read_manifest(bundle)
    assert set(manifest) >= MANIFEST_KEYS
    assert manifest["name"] == "minilm-l3" and manifest["version"] == "1" and manifest["parent"] == "base@1"
    assert datetime.fromisoformat(manifest["created_at"]).utcoffset().total_seconds() == 0
    assert manifest["source"]["sha256"] == sha256_file(minilm_l3_path / "model.safetensors")
    # every file that decides the embeddings: `embedder serve --models ./folder` exports again when one differs
    assert manifest["source"]["files"] == embedding_file_digests(minilm_l3_path)
    assert {
        "config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "modules.json", "1_Pooling/config.json",
        "sentence_bert_config.json",
    } <= set(manifest["source"]["files"])  # fmt: skip
    assert (manifest["layers"], manifest["source_layers"], manifest["dim"]) == (3, 3, 384)
    assert manifest["pooling"] == "mean" and manifest["normalized"] is True  # normalised although the source is not
    assert manifest["max_seq_length"] == 128
    assert manifest["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert manifest["output"] == "sentence_embedding" and manifest["quantization"] == "int8"
    assert manifest["onnx"] == {"fp32": "model.onnx", "int8": "model_int8.onnx"}
    assert manifest["serve_variant"] == "int8"
    assert {"tokenizer.json", "vocab.txt", "model.onnx", "model_int8.onnx"} <= set(manifest["files"])
    for relative, digest in manifest["files"].items():
        assert sha256_file(bundle / relative) == digest, relative
    parity = manifest["parity"]
    assert parity["probes"] >= 64 and parity["tokenizer_mismatches"] == 0
    assert parity["fp32"]["min_cosine"] >= 0.9999
    assert parity["int8"]["mean_cosine"] >= 0.99 and parity["int8"]["min_cosine"] >= 0.97
    model = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert dims == {name: ["batch", "sequence"] for name in manifest["inputs"]}
    assert [o.name for o in model.graph.output] == ["sentence_embedding"]


def test_int8_setting_chosen_by_measurement_on_this_cpu(l3_registry: Path, minilm_l3_path: Path) -> None:
    """Every optimum preset is tried (the fallbacks, with more of the graph in fp32, only when none passes); the kept
    one passed the bars here, and the manifest says on which CPU."""
    bundle = registry.current_bundle(l3_registry, "minilm-l3")
    record = registry.read_manifest(bundle)["int8"]
    assert [c["name"] for c in record["candidates"]] == [c.name for c in quantize.CANDIDATES if not c.fallback]
    assert all(c["fp32_matmuls"] == [] for c in record["candidates"])
    chosen = next(c for c in record["candidates"] if c["name"] == record["chosen"])
    assert chosen["failures"] == [] and chosen["mean_cosine"] >= 0.99 and chosen["min_cosine"] >= 0.97
    assert chosen["per_channel"] and chosen["seconds"] > 0
    for candidate in record["candidates"]:  # a failing setting is reported, never timed or kept
        assert (candidate["seconds"] is None) == bool(candidate["failures"])
    assert record["checked_on"] == runtime.cpu_features()
    assert not list(bundle.glob("int8-*.onnx"))  # the other candidates' graphs are gone
    texts, reference = runtime.read_probes(bundle)
    assert texts == probe_texts() and reference.shape == (len(texts), 384)
    assert runtime.cosines(torch_reference(minilm_l3_path).encode(texts[:8]), reference[:8]).min() >= 0.9999


def test_the_int8_graph_is_served_only_where_it_passes(l3_registry: Path, tmp_path: Path) -> None:
    source = registry.current_bundle(l3_registry, "minilm-l3")
    served, choice = load_engine(source, engine="onnxruntime-int8")
    check = choice.trial("onnxruntime-int8")
    assert (served.variant, check.status, choice.engine) == ("int8", "passed", "onnxruntime-int8")
    assert check.min_cosine >= 0.97 and choice.cpu == runtime.cpu_features()
    assert load_engine(source, serve_int8=False)[1].trial("onnxruntime-int8").status == "disabled"

    # The same graphs against references they cannot match (as on a CPU whose int8 kernels lose precision).
    bundle = tmp_path / "bundle"
    shutil.copytree(source, bundle)
    texts, reference = runtime.read_probes(bundle)
    runtime.write_probes(bundle, texts, np.roll(reference, 1, axis=1))
    served, choice = load_engine(bundle, engine="onnxruntime-int8")
    assert (served.variant, choice.trial("onnxruntime-int8").status) == ("fp32", "failed")
    assert "onnxruntime-int8: mean cosine to torch" in choice.trial("onnxruntime-int8").reason


def test_openvino_int8_graph_kept_only_within_the_bars_on_this_cpu(l3_registry: Path) -> None:
    """NNCF's int8 graph for OpenVINO, built beside onnxruntime's: its record says how close it came to torch on
    the probes here; kept (listed among the graphs, hashed, loadable) exactly when it kept the int8 bars."""
    bundle = registry.current_bundle(l3_registry, "minilm-l3")
    manifest = registry.read_manifest(bundle)
    record = manifest["openvino_int8"]
    assert record["calibration_texts"] == len(openvino_int8.calibration_texts()) and record["checked_on"]
    bars = runtime.ParityBars()
    within = record["mean_cosine"] >= bars.int8_mean_cosine and record["min_cosine"] >= bars.int8_min_cosine
    assert record["kept"] is within and bool(record["failures"]) is not within
    files = {"model_openvino_int8.xml", "model_openvino_int8.bin"}
    if within:
        assert manifest["openvino"] == {"openvino-int8": "model_openvino_int8.xml"} and files <= set(manifest["files"])
        assert runtime.graph_files(manifest)["openvino-int8"] == "model_openvino_int8.xml"
        graph = OnnxBundle(bundle, variant="openvino-int8", runtime="openvino")
        assert graph.encode(["a sentence", "another one"]).shape == (2, 384)
    else:
        assert manifest["openvino"] == {} and not files & {p.name for p in bundle.iterdir()}
    # calibration shares nothing with the probes the graph is held against
    assert not set(openvino_int8.calibration_texts()) & set(probe_texts())


def test_openvino_int8_graph_left_out_when_it_misses_the_bars_or_fails(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    impossible = runtime.ParityBars(int8_min_cosine=1.01)
    strict = functools.partial(openvino_int8.build_openvino_int8, bars=impossible)
    monkeypatch.setattr(exporter, "build_openvino_int8", strict)
    manifest = registry.read_manifest(exporter.export_bundle(tiny_bert_path, tmp_path, "strict", quantize="int8"))
    assert manifest["openvino"] == {} and manifest["openvino_int8"]["kept"] is False
    assert "openvino-int8: min cosine to torch" in manifest["openvino_int8"]["failures"][0]
    assert not any("openvino" in name for name in manifest["files"])

    def broken(*args: object, **kwargs: object) -> None:
        (args[0] / openvino_int8.OPENVINO_INT8_FILE).write_text("half a graph")
        raise RuntimeError("unsupported operation")

    monkeypatch.setattr(exporter, "build_openvino_int8", broken)
    bundle = exporter.export_bundle(tiny_bert_path, tmp_path, "broken-ov", quantize="int8")  # the export stands
    manifest = registry.read_manifest(bundle)
    assert manifest["openvino"] == {} and manifest["quantization"] == "int8"
    assert manifest["openvino_int8"] == {"kept": False, "failures": ["RuntimeError: unsupported operation"]}
    assert not any("openvino" in p.name for p in bundle.iterdir())
    none = registry.read_manifest(exporter.export_bundle(tiny_bert_path, tmp_path, "plain", quantize="none"))
    assert none["openvino"] == {} and none["openvino_int8"] is None


def test_auto_publishes_fp32_when_no_int8_setting_passes(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    impossible = runtime.ParityBars(int8_mean_cosine=1.01)
    monkeypatch.setattr(exporter, "choose_int8", functools.partial(quantize.choose_int8, bars=impossible))
    bundle_dir = exporter.export_bundle(tiny_bert_path, tmp_path, "tiny", quantize="auto")
    manifest = registry.read_manifest(bundle_dir)
    assert manifest["onnx"] == {"fp32": "model.onnx"} and manifest["serve_variant"] == "fp32"
    assert manifest["quantization"] == "none" and manifest["int8"]["chosen"] is None
    with pytest.raises(ParityError, match=r"(?s)avx512-reduce-range: int8: mean cosine.*avx2: int8: mean"):
        exporter.export_bundle(tiny_bert_path, tmp_path, "tiny", quantize="int8")
    assert registry.list_versions(tmp_path, "tiny") == ["1"]


def test_int8_falls_back_to_fp32_feed_forward_outputs_before_giving_up(l3_registry: Path, tmp_path: Path) -> None:
    """With bars no full-int8 preset keeps, the fallbacks are tried in order and the first that keeps them is the
    graph: the feed-forward output matmuls (found by their weights' shape) it names stay fp32 MatMuls, the rest int8."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    source = registry.current_bundle(l3_registry, "minilm-l3")
    for file in source.iterdir():
        if file.name != "model_int8.onnx":
            (bundle / file.name).symlink_to(file.resolve())
    graph = onnx.load(str(bundle / "model.onnx"), load_external_data=False)
    outputs = quantize.ffn_output_matmuls(graph)
    assert len(outputs) == 3 and all("layer." in name for name in outputs)  # one per layer of minilm-l3, in order
    assert [int(name.split("layer.")[1].split("/")[0]) for name in outputs] == [0, 1, 2]
    texts, reference = runtime.read_probes(bundle)
    full = [c for c in quantize.CANDIDATES if not c.fallback]
    first = quantize.choose_int8(bundle, "model_int8.onnx", reference, texts, candidates=full[:1])["candidates"][0]
    (bundle / "model_int8.onnx").unlink()
    fallbacks = [c for c in quantize.CANDIDATES if c.fallback]
    # a mean bar just above what the full-int8 graph keeps, no min bar: only keeping more in fp32 can pass
    bars = runtime.ParityBars(int8_mean_cosine=first["mean_cosine"] + 1e-6, int8_min_cosine=0.0)
    record = quantize.choose_int8(
        bundle, "model_int8.onnx", reference, texts, candidates=(full[0], *fallbacks), bars=bars
    )
    tried = {c["name"]: c for c in record["candidates"]}
    assert tried[full[0].name]["failures"] and tried[full[0].name]["fp32_matmuls"] == []
    assert tried[fallbacks[0].name]["fp32_matmuls"] == outputs[:1]
    if record["chosen"] == fallbacks[0].name:  # keeping more in fp32 passed: the next fallback was never tried
        assert list(tried) == [full[0].name, fallbacks[0].name]
    else:
        assert tried[fallbacks[1].name]["fp32_matmuls"] == outputs
    if record["chosen"] is not None:
        kept = onnx.load(str(bundle / "model_int8.onnx"), load_external_data=False)
        fp32_matmuls = [n.name for n in kept.graph.node if n.op_type == "MatMul"]
        assert fp32_matmuls == tried[record["chosen"]]["fp32_matmuls"]
        assert any(n.op_type == "MatMulInteger" for n in kept.graph.node)


def test_real_weights_dynamic_axes(l3_registry: Path, minilm_l3_path: Path, varied_texts: list[str]) -> None:
    bundle_dir = registry.current_bundle(l3_registry, "minilm-l3")
    encoder = torch_reference(minilm_l3_path)
    texts = batch_of_17(varied_texts)
    assert len(texts) == 17
    assert onnx_vs_torch(bundle_dir, encoder, texts).min() >= 0.9999
    int8 = onnx_vs_torch(bundle_dir, encoder, texts, variant="int8")
    assert int8.mean() >= 0.99 and int8.min() >= 0.97
    single = OnnxBundle(bundle_dir, variant="fp32")
    assert [len(e.ids) for e in single.tokenize(["ok", texts[8]])] == [3, 128]
    for text in ("ok", texts[8]):  # batch 1 at sequence lengths 3 and max
        assert onnx_vs_torch(bundle_dir, encoder, [text]).min() >= 0.9999


# --- tiny random models of each architecture family --------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "pooling", "inputs"),
    [
        ("tiny_bert_path", "mean", ["input_ids", "attention_mask", "token_type_ids"]),
        ("tiny_electra_path", "cls", ["input_ids", "attention_mask", "token_type_ids"]),
        ("tiny_mpnet_path", "mean", ["input_ids", "attention_mask"]),
    ],
)
def test_architectures_pool_in_graph(
    fixture: str, pooling: str, inputs: list[str], request: pytest.FixtureRequest, tmp_path: Path,
    varied_texts: list[str],
) -> None:  # fmt: skip
    path = request.getfixturevalue(fixture)
    bundle_dir = exporter.export_bundle(path, tmp_path, "tiny")
    manifest = registry.read_manifest(bundle_dir)
    assert manifest["pooling"] == pooling and manifest["inputs"] == inputs
    assert manifest["serve_variant"] == "fp32" and registry.current_version(tmp_path, "tiny") is None
    encoder = torch_reference(path)
    assert onnx_vs_torch(bundle_dir, encoder, batch_of_17(varied_texts)).min() >= 0.9999
    for text in ("ok", "tokens " * 400):
        assert onnx_vs_torch(bundle_dir, encoder, [text]).min() >= 0.9999


def test_truncated_export_equals_truncated_torch(tiny_bert_path: Path, tmp_path: Path, varied_texts: list[str]) -> None:
    caller_encoder = Encoder.from_pretrained(tiny_bert_path)
    bundle_dir = exporter.export_bundle(caller_encoder, tmp_path, "tiny-l2", layers=2, method={"name": "tmft"})
    assert caller_encoder.num_layers == 4  # the caller's encoder is copied, never truncated
    manifest = registry.read_manifest(bundle_dir)
    assert (manifest["layers"], manifest["source_layers"]) == (2, 4)
    assert manifest["method"] == {"name": "tmft"}
    truncated = onnx_vs_torch(bundle_dir, torch_reference(tiny_bert_path, layers=2), varied_texts)
    assert truncated.min() >= 0.9999
    full = onnx_vs_torch(bundle_dir, torch_reference(tiny_bert_path), varied_texts)
    # It really is the 2-layer model: far closer to the truncated torch model than to the full one.
    assert 1 - full.min() > 1000 * (1 - truncated.min())


def test_output_layer_is_in_the_graph(minilm_l3_path: Path, tmp_path: Path, varied_texts: list[str]) -> None:
    """A student's Dense output layer (128 → 384 in distil-tiny-pca) is traced with the rest: the bundle's vectors
    are the torch model's, at the output layer's width."""
    student = tiny_bert_student(Encoder.from_pretrained(minilm_l3_path), hidden_size=32, num_heads=2, output_dim=384)
    student.save(tmp_path / "student")
    bundle_dir = exporter.export_bundle(tmp_path / "student", tmp_path / "registry", "tiny-dense")
    assert registry.read_manifest(bundle_dir)["dim"] == 384
    assert onnx_vs_torch(bundle_dir, torch_reference(tmp_path / "student"), varied_texts).min() >= 0.9999


def test_int8_within_tolerance_on_random_model(tiny_bert_path: Path, tmp_path: Path, varied_texts: list[str]) -> None:
    bundle_dir = exporter.export_bundle(tiny_bert_path, tmp_path, "tiny-int8", quantize="int8")
    int8 = onnx_vs_torch(bundle_dir, torch_reference(tiny_bert_path), varied_texts, variant="int8")
    assert int8.mean() >= 0.99 and int8.min() >= 0.97
    assert OnnxBundle(bundle_dir).variant == "int8"


# --- failures leave the registry untouched -----------------------------------------------------


def test_parity_failure_lists_all_and_publishes_nothing(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = graph.optimize_graph

    def corrupt_weights(src: Path, dst: Path, encoder: Encoder, **kwargs: object) -> Path:
        original(src, dst, encoder, **kwargs)
        model = onnx.load(str(dst))
        for init in model.graph.initializer:
            if init.name.endswith("word_embeddings.weight"):
                array = onnx.numpy_helper.to_array(init)
                rng = np.random.default_rng(0)
                init.CopyFrom(onnx.numpy_helper.from_array(rng.permutation(array), init.name))
        onnx.save(model, str(dst))
        return Path(dst)

    monkeypatch.setattr(graph, "optimize_graph", corrupt_weights)
    root = tmp_path / "registry"
    listing = r"(?s)nothing was published.*fp32: min cosine .* < 0.9999.*int8: mean cosine"
    with pytest.raises(ParityError, match=listing) as info:
        exporter.export_bundle(tiny_bert_path, root, "broken", quantize="int8", promote=True)
    assert len(info.value.failures) >= 2
    assert info.value.figures["fp32"]["min_cosine"] < 0.9999
    assert not root.exists()


def test_validate_hook_report_and_veto(tiny_bert_path: Path, tmp_path: Path) -> None:
    def passing(staging: Path) -> dict:
        assert (staging / "model.onnx").is_file() and not str(staging).startswith(str(tmp_path))
        (staging / "report.md").write_text("# validation\n")
        return {"passed": True, "score": 0.5}

    bundle_dir = exporter.export_bundle(tiny_bert_path, tmp_path, "gated", validate=passing, promote=True)
    manifest = registry.read_manifest(bundle_dir)
    assert manifest["validation"] == {"passed": True, "score": 0.5}
    assert manifest["files"]["report.md"] == sha256_file(bundle_dir / "report.md")

    def failing(staging: Path) -> dict:
        raise RuntimeError("gate says no")

    with pytest.raises(RuntimeError, match="gate says no"):
        exporter.export_bundle(tiny_bert_path, tmp_path, "gated", validate=failing, promote=True)
    assert registry.list_versions(tmp_path, "gated") == ["1"]
    assert registry.current_version(tmp_path, "gated") == "1"
    assert sorted(p.name for p in (tmp_path / "gated").iterdir()) == [".lock", "1", "current"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": "Bad/Name"}, registry.RegistryError, "invalid model name"),
        ({"quantize": "fp16"}, ValueError, r"quantize must be one of \('none', 'int8', 'auto'\)"),
        ({"layers": 9}, ValueError, r"layers must be an integer between 1 and 4"),
        ({"pooling": "weightedmean"}, ValueError, "pooling must be one of"),
    ],
)
def test_bad_arguments_say_what_to_fix(
    tiny_bert_path: Path, tmp_path: Path, kwargs: dict, error: type[Exception], match: str
) -> None:
    arguments = {"name": "tiny", **kwargs}
    with pytest.raises(error, match=match):
        exporter.export_bundle(tiny_bert_path, tmp_path / "registry", **arguments)
    assert not (tmp_path / "registry").exists()


def test_concurrent_exports_get_distinct_versions(tiny_bert_path: Path, tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    # Two processes, as two /adapt workers would be; one torch thread each on the 2-core machine.
    with ProcessPoolExecutor(2, mp_context=context, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        futures = [pool.submit(exporter.export_bundle, tiny_bert_path, tmp_path, "same") for _ in range(2)]
        versions = [future.result().name for future in futures]
    assert sorted(versions) == ["1", "2"]
    assert registry.list_versions(tmp_path, "same") == ["1", "2"]
    first, second = (registry.read_manifest(tmp_path / "same" / v) for v in ("1", "2"))
    assert first["source"] == second["source"]  # same source, new version: never overwritten


def test_probe_set_is_varied() -> None:
    texts = probe_texts()
    assert len(texts) >= 64 and len(set(texts)) == len(texts)
    assert any(len(t.split()) <= 1 for t in texts)
    assert sum(len(t.split()) > 300 for t in texts) >= 3  # cut at any max_seq_length up to 512
    assert sum(any(ord(c) > 0x2FF for c in t) for t in texts) >= 10  # CJK, Cyrillic, Greek, Arabic, emoji


def test_manifest_records_the_corpora_of_the_checkpoints_recipe(tiny_bert_path: Path, tmp_path: Path) -> None:
    run = tmp_path / "runs" / "acl"
    shutil.copytree(tiny_bert_path, run / "best")
    (run / "recipe.json").write_text(json.dumps({"corpus": "enwiki+aclsum", "trained_on": ["enwiki", "aclsum"]}))
    bundle = exporter.export_bundle(run / "best", tmp_path / "registry", "acl")
    assert registry.read_manifest(bundle)["trained_on"] == ["enwiki", "aclsum"]
    assert load_model(bundle).trained_on == ("enwiki", "aclsum")
    adapted = exporter.export_bundle(run / "best", tmp_path / "registry", "acl", trained_on=["enwiki", "adapt:acl"])
    assert registry.read_manifest(adapted)["trained_on"] == ["enwiki", "adapt:acl"]
    # a folder without a recipe (a downloaded model) declares nothing: every task is out-of-domain for it
    plain = exporter.export_bundle(tiny_bert_path, tmp_path / "registry", "plain")
    assert registry.read_manifest(plain)["trained_on"] == []
