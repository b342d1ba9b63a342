"""Report files: ``report.json`` (everything), ``report.md`` (tables) and PNG plots (matplotlib, Agg).

Plots: ``tasks.png`` — per-task bars, candidate vs baseline; ``layers.png`` — layer-wise curves
(layer 0 = embeddings, no fine-tuning; paper 000 Figure 4b); ``speed.png`` — throughput per setting.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on servers and CI
import matplotlib.pyplot as plt
import numpy as np

from core.durable import write_atomic

COLORS = {"candidate": "#1f77b4", "baseline": "#ff7f0e"}


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=0o644)  # reports are meant to be read by others


def _strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None: mteb leaves some secondary metrics undefined (a
    retrieval nAUC when every query finds its document in the top k), and ``NaN`` is not JSON — JavaScript, Go or
    a strict Python parser refuse the whole file."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict_json(v) for v in value]
    return value


def _models(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(role, report[role]) for role in ("candidate", "baseline") if report.get(role)]


def plot_tasks(report: dict[str, Any], path: Path) -> Path:
    """Grouped bars: score per task (points) for the candidate and, if any, the baseline."""
    models = _models(report)
    tasks = list(dict.fromkeys(t for _, m in models for t in m["scores"]))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(tasks) + 2), 4.2))
    width = 0.8 / max(1, len(models))
    x = np.arange(len(tasks))
    for i, (role, model) in enumerate(models):
        values = [model["scores"].get(t, np.nan) for t in tasks]
        bars = ax.bar(
            x + i * width - 0.4 + width / 2,
            values,
            width,
            label=f"{role}: {model['model']['name']}",
            color=COLORS[role],
        )
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
    ax.set_xticks(
        x,
        [t.replace("Retrieval", "Retr.").replace("Classification", "Clf.") for t in tasks],
        rotation=20,
        ha="right",
        fontsize=8,
    )
    ax.set_ylabel("score (points, 0-100)")
    ax.set_ylim(0, 105)
    ax.set_title("Offline suite" + (" (fast mode)" if report.get("fast") else ""))
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_layers(curves: dict[str, dict[str, list[float]]], path: Path, title: str = "Layer-wise quality") -> Path:
    """One panel per task; one line per model. ``curves``: ``{model label: {task: [score per layer]}}``."""
    tasks = list(dict.fromkeys(t for per_task in curves.values() for t in per_task))
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(4.2 * max(1, len(tasks)), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        for label, per_task in curves.items():
            if task in per_task:
                ys = per_task[task]
                ax.plot(range(len(ys)), ys, marker="o", label=label)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_ylabel("score (points)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speed(report: dict[str, Any], path: Path) -> Path:
    models = [(role, m) for role, m in _models(report) if m.get("speed")]
    settings = list(dict.fromkeys(r["setting"] for _, m in models for r in m["speed"]["settings"]))
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    width = 0.8 / max(1, len(models))
    x = np.arange(len(settings))
    for i, (role, model) in enumerate(models):
        by = {r["setting"]: r["texts_per_s"] for r in model["speed"]["settings"]}
        ax.bar(
            x + i * width - 0.4 + width / 2,
            [by.get(s, np.nan) for s in settings],
            width,
            label=f"{role}: {model['model']['name']}",
            color=COLORS[role],
        )
    ax.set_xticks(x, settings)
    ax.set_yscale("log")
    ax.set_ylabel("texts / s (log)")
    ax.set_title("Throughput (short/long texts, batch 1/32)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cell(value: Any, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def describe_trained_on(domains: dict[str, Any]) -> str:
    """The corpora a model declares, or why it declares none (for reports and the terminal)."""
    if not domains["declared"]:
        return "none declared (training data unknown: every task counts as out-of-domain)"
    return ", ".join(domains["trained_on"])


def _domain_lines(report: dict[str, Any]) -> list[str]:
    models = [(role, m) for role, m in _models(report) if m.get("domains")]
    if not models:
        return []
    lines = [
        "",
        "## Out-of-domain and in-domain (points)",
        "",
        "| model | trained on | out-of-domain average | out-of-domain tasks | in-domain average | in-domain tasks |",
        "|---|---|---:|---|---:|---|",
    ]
    for role, model in models:
        d = model["domains"]
        ood, ind = d["out_of_domain"], d["in_domain"]
        lines.append(
            f"| {role} `{model['model']['name']}` | {describe_trained_on(d)} | {_cell(ood['average'])} | "
            f"{', '.join(ood['tasks']) or '-'} | {_cell(ind['average'])} | {', '.join(ind['tasks']) or '-'} |"
        )
    lines += [
        "",
        "A task is in-domain when the domain of the corpus it draws from (news, NLP papers, …) is one the model "
        "was trained or adapted on; the out-of-domain average is the headline (docs/EVALUATION.md).",
    ]
    return lines


def render_markdown(report: dict[str, Any], plots: dict[str, str]) -> str:
    """The human-readable report."""
    cand, base, gate = report["candidate"], report.get("baseline"), report.get("gate")
    lines = [f"# Validation report: {cand['model']['name']}", ""]
    lines += [f"- created: {report['created_at']}", f"- command: `{report['command']}`"]
    if report.get("fast"):
        lines.append("- **fast mode**: a few documents per task; scores are smoke-test numbers, not comparable")
    for role, model in _models(report):
        info = model["model"]
        source = f" from `{info['source']}`" if info.get("source") else ""
        source += f", {info['variant']} graph on {info['engine']}" if info.get("variant") else ""
        lines.append(
            f"- {role}: `{info['name']}`{source} ({info['kind']}, {info['num_layers']} layers, dim {info['dim']}, "
            f"max_seq_length {info['max_seq_length']}, hash `{info['hash'][:12]}`)"
        )
    env = report.get("environment")
    if env:
        versions = ", ".join(f"{name} {version}" for name, version in env["packages"].items() if version)
        lines.append(
            f"- machine: {env['cpu']['model']} ({env['cpu_count']} cores; {', '.join(env['cpu']['flags']) or '-'}), "
            f"{env['platform']}, Python {env['python']}; {versions}"
        )
    if gate is not None:
        verdict = "**PASSED**" if gate["passed"] else "**FAILED**"
        lines += [
            f"- gate: {verdict} (max drop {report['max_drop']:g} points"
            + (f", min speedup {report['min_speedup']:g}x" if report.get("min_speedup") else "")
            + ")"
        ]
    headline = (gate or {}).get("headline")
    if headline:
        lines.append(
            f"- headline, the out-of-domain average over the candidate's {len(headline['tasks'])} out-of-domain "
            f"tasks: **{headline['candidate']:.2f}** vs {headline['baseline']:.2f} ({headline['delta']:+.2f} points)"
        )
    lines += _domain_lines(report)
    lines += ["", "## Tasks (points, 0-100)", ""]
    if gate is not None:
        lines += ["| task | candidate | baseline | delta | status |", "|---|---:|---:|---:|---|"]
        for row in gate["table"]:
            lines.append(
                f"| {row['task']} | {_cell(row['candidate'])} | {_cell(row['baseline'])} | "
                f"{_cell(row['delta'], '{:+.2f}')} | {row['status']} |"
            )
        if gate["failures"]:
            lines += ["", "Failures:", ""] + [f"- {f}" for f in gate["failures"]]
    else:
        lines += ["| task | score | metric |", "|---|---:|---|"]
        for task, entry in cand["tasks"].items():
            lines.append(f"| {task} | {entry['score']:.2f} | {entry['main_metric']} |")
    skipped = {**(base or {}).get("skipped", {}), **cand.get("skipped", {})}
    if skipped:
        lines += ["", "Skipped:", ""] + [f"- {t}: {r}" for t, r in skipped.items()]
    for role, model in _models(report):
        if model.get("failed"):
            lines += ["", f"No score ({role} `{model['model']['name']}`):", ""]
            lines += [f"- {t}: {r}" for t, r in model["failed"].items()]
    if "tasks" in plots:
        lines += ["", f"![tasks]({plots['tasks']})"]
    diag_models = [(role, m) for role, m in _models(report) if m.get("diagnostics")]
    if diag_models:
        keys = list(dict.fromkeys(k for _, m in diag_models for k in m["diagnostics"]))
        lines += [
            "",
            "## Diagnostics",
            "",
            "| diagnostic | " + " | ".join(r for r, _ in diag_models) + " |",
            "|---|" + "---:|" * len(diag_models),
        ]
        for key in keys:
            lines.append(
                f"| {key} | " + " | ".join(_cell(m["diagnostics"].get(key), "{:.3f}") for _, m in diag_models) + " |"
            )
        lines += [
            "",
            "kNN: paper 000 §3.3, Table 2 (k = 10, 9:1 split; here on BBC); effective rank: paper 002 §2.2.1, Eq. 2; "
            "alignment (crop pairs) and uniformity: Wang & Isola (2020); dcl_alignment and dcl_uniformity (crop "
            "pairs, τ = 0.05): paper 002 §3.1, Eq. 4 and 5, the terms of the decoupled contrastive loss it plots "
            "in Figure 3 (the uniformity term grows with the number of pairs).",
        ]
    layer_models = [(role, m) for role, m in _models(report) if m.get("layers")]
    if layer_models:
        lines += ["", "## Layer-wise scores (points; layer 0 = embeddings)", ""]
        for role, model in layer_models:
            for task, ys in model["layers"].items():
                best = int(np.argmax(ys))
                lines.append(
                    f"- {role} `{model['model']['name']}` {task}: "
                    + ", ".join(f"L{i} {y:.1f}" for i, y in enumerate(ys))
                    + f" (best: layer {best})"
                )
        if "layers" in plots:
            lines += ["", f"![layers]({plots['layers']})"]
    speed_models = [(role, m) for role, m in _models(report) if m.get("speed")]
    if speed_models:
        lines += ["", "## Speed", "", "| model | setting | texts/s | p50 latency (ms) |", "|---|---|---:|---:|"]
        for role, model in speed_models:
            for row in model["speed"]["settings"]:
                lines.append(f"| {role} | {row['setting']} | {row['texts_per_s']:.1f} | {row['p50_ms']:.1f} |")
        threads = speed_models[0][1]["speed"].get("threads")
        lines += ["", f"Threads: {threads}. Timings include tokenisation; a shared machine makes them noisy."]
        if "speed" in plots:
            lines += ["", f"![speed]({plots['speed']})"]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write report.json, report.md and the plots into ``out_dir``; returns the written paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    plots: dict[str, str] = {}
    if report["candidate"].get("scores"):
        written["tasks.png"] = plot_tasks(report, out_dir / "tasks.png")
        plots["tasks"] = "tasks.png"
    curves = {f"{role}: {m['model']['name']}": m["layers"] for role, m in _models(report) if m.get("layers")}
    if curves:
        written["layers.png"] = plot_layers(curves, out_dir / "layers.png")
        plots["layers"] = "layers.png"
    if any(m.get("speed") for _, m in _models(report)):
        written["speed.png"] = plot_speed(report, out_dir / "speed.png")
        plots["speed"] = "speed.png"
    report = {**report, "plots": plots}
    text = json.dumps(_strict_json(report), indent=1, default=str, allow_nan=False)
    _atomic_write(out_dir / "report.json", text + "\n")
    written["report.json"] = out_dir / "report.json"
    _atomic_write(out_dir / "report.md", render_markdown(report, plots))
    written["report.md"] = out_dir / "report.md"
    return written
