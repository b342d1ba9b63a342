"""What README.md and docs/ tell a user to type or to expect exists: every `EMBED_*` variable they name is read by the
code; every flag of a command they show (`embedder COMMAND`, `scripts/serve.sh`, `benchmarks/*.py`) is one that
command's parser declares (read with `ast`, or for `embedder serve` built from the settings: nothing runs); every
`--set` is a recipe field or a chart value, and each `embedder train` loads its recipe with all its overrides; the
metrics and error tables of docs/API.md are the service's."""

from __future__ import annotations

import ast
import itertools
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SUBCOMMANDS = "models|registry|export|adapt-worker|adapt|serve|train|validate|layers|bench"
COMMAND = re.compile(rf"\b(embedder (?:{SUBCOMMANDS})\b|scripts/serve\.sh|benchmarks/\w+\.py)")
FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*(?![\w<-])")
PLACEHOLDERS = {"--flag"}  # "every setting is an `embedder serve --flag`"


def snippets(text: str) -> list[tuple[int, str]]:
    """Each command line of a fenced block (continuation lines joined, comments dropped) and each inline code span."""
    found: list[tuple[int, str]] = []
    fenced, pending, start = False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            found += [(number, span) for span in re.findall(r"`([^`]+)`", line)]
            continue
        start = start or number
        pending += re.sub(r"\s#\s.*$", "", line.rstrip()).removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            found.append((start, pending))
            pending, start = "", 0
    return found


def documented_flags() -> list[tuple[str, str, str]]:
    """(where, command, flag) for every flag written after a command, up to the next command, pipe or `--`."""
    out = []
    for doc in DOCS:
        for number, snippet in snippets(doc.read_text()):
            commands = list(COMMAND.finditer(snippet))
            for i, command in enumerate(commands):
                end = commands[i + 1].start() if i + 1 < len(commands) else len(snippet)
                words = re.split(r"\s(?:\||&&|;)\s", snippet[command.end() : end])[0].split(" -- ")[0]
                where = f"{doc.relative_to(ROOT)}:{number}"
                out += [(where, command[1], flag) for flag in FLAG.findall(words) if flag not in PLACEHOLDERS]
    return out


def declared_flags(*paths: Path) -> set[str]:
    """The option strings of every `add_argument` call in these files (``--no-x`` too for a BooleanOptionalAction)."""
    flags: set[str] = {"--help"}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
                flags.update(names)
                if any(getattr(k.value, "attr", None) == "BooleanOptionalAction" for k in node.keywords):
                    flags.update("--no-" + name[2:] for name in names)
    return flags


@cache
def flags_of(command: str) -> frozenset[str]:
    if command in ("embedder serve", "scripts/serve.sh"):  # its flags are made from the settings
        from service.cli import build_parser

        parser = build_parser()
        return frozenset(s for a in parser._actions for s in a.option_strings)
    if command.startswith("embedder "):
        from embedder.cli import COMMANDS

        module = ROOT / (COMMANDS[command.split()[1]][0].partition(":")[0].replace(".", "/") + ".py")
        return frozenset(declared_flags(module, *_project_imports(module)))  # a shared flag (`add_registry_flag`)
    script = ROOT / command
    helpers = {p.stem: p for p in script.parent.glob("*.py")}  # the scripts' own helpers, imported by name
    imported: set[str] = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    return frozenset(declared_flags(script, *(helpers[name] for name in imported if name in helpers)))


def _project_imports(path: Path) -> list[Path]:
    """The project's modules ``path`` imports names from (``from core.settings import …``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            candidate = ROOT / (node.module.replace(".", "/") + ".py")
            if candidate.is_file():
                found.append(candidate)
    return found


def test_every_flag_the_docs_show_is_declared_by_its_command() -> None:
    flags = documented_flags()
    assert len(flags) > 100, "the docs' commands were not found"
    wrong = [f"{where}: `{command} {flag}`" for where, command, flag in flags if flag not in flags_of(command)]
    assert not wrong, wrong


def test_the_flag_reader_sees_boolean_flags_and_helpers(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import argparse\np=argparse.ArgumentParser()\np.add_argument('--a', '-a')\n"
                      "p.add_argument('--b', action=argparse.BooleanOptionalAction)\n")  # fmt: skip
    assert declared_flags(script) == {"--help", "--a", "--b", "--no-b"}
    assert "--bundle" in flags_of("benchmarks/bench_routes.py")  # declared by its helper, bundle_args
    assert {"--adapt-max-steps", "--no-adapt-enabled"} <= flags_of("embedder serve")


def environment_variables_read() -> set[str]:
    """``EMBED_*`` of every setting, and those a command reads itself as a flag's default (``os.environ.get``)."""
    from core.settings import Settings
    from service.settings import ServiceSettings

    names = {f"EMBED_{name.upper()}" for name in [*ServiceSettings.flat_fields(), *Settings.model_fields]}
    for path in (ROOT / "embedder").glob("*.py"):
        names.update(re.findall(r"os\.environ\.get\(\"(EMBED_[A-Z0-9_]+)\"", path.read_text()))
    return names


def test_every_embed_variable_the_docs_name_is_read() -> None:
    known = environment_variables_read()
    wrong = [
        f"{doc.relative_to(ROOT)}:{number}: {name}"
        for doc in DOCS
        for number, line in enumerate(doc.read_text().splitlines(), 1)
        for name in re.findall(r"\bEMBED_[A-Z0-9_]*[A-Z0-9]\b", line)
        if name not in known and not line[line.index(name) + len(name) :].startswith("_*")  # a prefix: EMBED_ADAPT_*
    ]
    assert not wrong, wrong


def documented_overrides() -> list[tuple[str, list[tuple[str, str]]]]:
    """(where, [(key, value), ...]) of the `--set key=value` of each line of the docs (values with shell variables or
    placeholders left out), but of an example of the error an unknown key gets."""
    out = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            pairs = []
            for quoted, bare in re.findall(r"--set\s+(?:'([^']*)'|([^\s`'\"]+))", line):
                key, _, value = (quoted or bare.rstrip("),.;:")).partition("=")
                if re.fullmatch(r"[A-Za-z_][\w.]*", key) and key != "key" and not re.search(r"[$<…]", value):
                    pairs.append((key, value))
            if pairs and "unknown config key" not in line:
                out.append((f"{doc.relative_to(ROOT)}:{number}", pairs))
    return out


def test_every_override_the_docs_show_is_a_recipe_field_or_a_chart_value() -> None:
    import yaml

    from training.config import ConfigError, load_config

    recipes = sorted(p.stem for p in (ROOT / "training" / "recipes").glob("*.toml"))
    values = yaml.safe_load((ROOT / "helm" / "embedder" / "values.yaml").read_text())

    def chart_value(path: str) -> bool:
        node = values
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    def some_recipe_takes(items: list[str]) -> bool:  # objective_params depend on the objective, so on the recipe
        for recipe in recipes:
            try:
                load_config(recipe, items)
                return True
            except ConfigError:
                pass
        return False

    lines = documented_overrides()
    assert sum(len(pairs) for _, pairs in lines) > 50, "the docs' overrides were not found"
    wrong = []
    for where, pairs in lines:
        items = [f"{key}={value}" for key, value in pairs]
        if where.startswith("docs/DEPLOY.md"):  # helm's
            wrong += [f"{where}: --set {key}={value}" for key, value in pairs if not chart_value(key)]
        elif not some_recipe_takes(items):  # an override may need another of its line (objective, objective_params)
            wrong += [f"{where}: --set {item}" for item in items if not some_recipe_takes([item])]
    assert not wrong, wrong


@pytest.mark.filterwarnings("ignore:recipe .* is now called")  # a run recorded under a recipe's old name
def test_every_embedder_train_command_in_the_docs_loads_its_recipe_with_its_overrides() -> None:
    """`embedder train RECIPE --set ...` as shown: the recipe with all of the command's overrides is a valid config (a
    setting one recipe takes may be refused on another: another objective, a validation metric)."""
    import shlex

    from training.config import ConfigError, load_config, resolve_recipe

    checked, wrong = 0, []
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        for number, snippet in snippets("\n".join(lines)):
            if "unknown config key" in lines[number - 1]:  # an example of the error itself
                continue
            commands = list(COMMAND.finditer(snippet))
            for i, command in enumerate(commands):
                end = commands[i + 1].start() if i + 1 < len(commands) else len(snippet)
                if command[1] != "embedder train":
                    continue
                text = re.split(r"\s(?:\||&&|;)\s", snippet[command.end() : end])[0]
                try:
                    words = shlex.split(text)
                except ValueError:  # a quote the span cuts off
                    words = text.split()
                if not words:
                    continue
                try:
                    resolve_recipe(words[0])
                except ConfigError:  # a placeholder: RECIPE, my-recipe.toml
                    continue
                overrides = itertools.pairwise(words)
                items = [value for flag, value in overrides if flag == "--set" and not re.search(r"[$<]", value)]
                try:
                    load_config(words[0], items)
                    checked += 1
                except ConfigError as err:
                    wrong.append(f"{doc.relative_to(ROOT)}:{number}: embedder train {words[0]} {items}: {err}")
    assert checked > 20 and not wrong, wrong


def exported_metrics() -> dict[str, set[str]]:
    """Every series family the service exports, as scraped (counters with ``_total``), and its label names: those of
    `ServiceMetrics`, and the /adapt collector's, made at each scrape (`service.adapt.api_state.AdaptCollector`)."""
    from service.metrics import ServiceMetrics

    families: dict[str, set[str]] = {}
    for metric in vars(ServiceMetrics()).values():
        if hasattr(metric, "_labelnames"):
            families[metric._name + ("_total" if metric._type == "counter" else "")] = set(metric._labelnames)
    source = (ROOT / "service" / "adapt" / "api_state.py").read_text()
    for kind, name, labels in re.findall(r"(\w+)MetricFamily\(\s*\"(\w+)\"[^)]*?(?:labels=\[([^\]]*)\])?\)", source):
        families[name + ("_total" if kind == "Counter" else "")] = set(re.findall(r"\"(\w+)\"", labels))
    return families


def test_the_metrics_table_lists_every_series_with_its_labels_and_the_docs_name_no_other() -> None:
    families = exported_metrics()
    assert {"embed_requests_total", "embed_queue_depth", "embed_adapt_jobs"} <= set(families)
    rows: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "API.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`embed_"):
            labels = {re.sub(r"\s*\(.*\)", "", label).strip() for label in cells[2].split(",")} - {""}
            rows.update({name: labels for name in re.findall(r"`(embed_\w+)`", cells[0])})
    assert rows == families
    suffixes = ("", "_bucket", "_sum", "_count")
    named = {
        f"{doc.relative_to(ROOT)}: {name}"
        for doc in [*DOCS, *(ROOT / "helm").rglob("*.yaml")]
        for name in re.findall(r"\bembed_[a-z0-9_]+\b", doc.read_text())
        if not any(name.removesuffix(suffix) in families for suffix in suffixes if name.endswith(suffix))
    }
    assert not named, sorted(named)


def test_the_error_table_is_the_services_error_table() -> None:
    """docs/API.md's table of statuses, codes and types holds `service.errors.ErrorKind`'s rows, and names each kind:
    in the table, or (the /adapt ones) with its status in the paragraph below it."""
    from service.errors import ErrorKind

    text = (ROOT / "docs" / "API.md").read_text()
    rows = set(re.findall(r"^\| (\d{3}) \| `(\w+)` \| `(\w+)` \|", text, flags=re.MULTILINE))
    kinds = {(str(kind.status), kind.code, kind.type): kind for kind in ErrorKind}
    assert rows <= set(kinds), rows - set(kinds)
    adapt = text.split("`/adapt` answers the same shape with codes of its own", 1)[1].split("\n\n", 1)[0]
    missing = [
        kind.name
        for row, kind in kinds.items()
        if row not in rows and not (f"`{kind.code}`" in adapt and str(kind.status) in adapt)
    ]
    assert not missing, missing
