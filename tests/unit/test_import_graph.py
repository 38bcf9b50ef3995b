"""Dependencies run one way: no gpuflow module imports, at any depth (lazy imports included), one that imports it."""

import ast
from pathlib import Path

from tests.helpers import ROOT

PLUGINS = ROOT / "plugins"


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for path in (PLUGINS / "gpuflow").rglob("*.py"):
        name = ".".join(path.relative_to(PLUGINS).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert "gpuflow.dataflow.gpu_options" in graph["gpuflow.preflight.gpu_rules"]
    assert cycles(graph) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same imports between packages: gpuflow.platform.gcp and gpuflow.platform.local are gpuflow.platform."""

    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if (PLUGINS / Path(*parts[:2])).is_dir() else module

    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(package(module), set()).update(
            package(target) for target in targets if package(target) != package(module))
    return packages


def test_the_package_graph_has_no_cycle():
    """A function-level import can hide a loop between packages (quota and platform, preflight and dataproc were)."""
    packages = package_graph(import_graph())
    assert {"gpuflow.platform", "gpuflow.preflight", "gpuflow.gpus", "gpuflow.dataproc", "gpuflow.dataflow",
            "gpuflow.configuration", "gpuflow.runs", "gpuflow.images", "gpuflow.composer",
            "gpuflow.tools"} <= set(packages)
    assert cycles(packages) == []


def test_a_package_cycle_is_found():
    graph = {"gpuflow.gpus.quota": {"gpuflow.platform.local"}, "gpuflow.platform.gcp": {"gpuflow.gpus.quota"},
             "gpuflow.platform.local": set()}
    assert cycles(package_graph(graph)) == [["gpuflow.gpus", "gpuflow.platform", "gpuflow.gpus"]]


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


#: What gpuflow knows, grouped by what it serves (the configuration, a run, Dataflow, GPUs, Dataproc, images,
#: Composer, the catalog): plain rules and data that every layer reads and that name no layer, task or tool.
KNOWLEDGE = ("gpuflow.catalog", "gpuflow.configuration", "gpuflow.runs", "gpuflow.dataflow", "gpuflow.gpus",
             "gpuflow.dataproc", "gpuflow.images", "gpuflow.composer")
#: The runtime's layers, lowest first: each may import the ones below it, the knowledge above and the shared modules
#: at the top of gpuflow/, never one above it (operators sit above them all and only the DAGs and the tools import
#: them). gpuflow.site_dags makes the DAGs: only the DAG files import it.
LAYERS = ("gpuflow.platform", "gpuflow.steps", "gpuflow.triggers", "gpuflow.operators", "gpuflow.site_dags")
#: preflight judges what the platform reads; steps and triggers never ask for it.
BESIDE = {"gpuflow.preflight": ("gpuflow.steps", "gpuflow.triggers", "gpuflow.operators")}


def upward_reaches(packages: dict[str, set[str]]) -> list[tuple[str, str]]:
    found = []
    for package in KNOWLEDGE:
        found += [(package, target) for target in sorted(packages.get(package, ()))
                  if target in (*LAYERS, "gpuflow.preflight", "gpuflow.tools")]
    for low, package in enumerate(LAYERS):
        found += [(package, target) for target in sorted(packages.get(package, ())) if target in LAYERS[low + 1:]]
    for package, above in BESIDE.items():
        found += [(package, target) for target in sorted(packages.get(package, ())) if target in above]
    for top in ("gpuflow.operators", "gpuflow.tools", "gpuflow.site_dags"):  # only the DAGs (and tools) import these
        found += [(package, top) for package in sorted(packages)
                  if top in packages[package] and package not in (top, "gpuflow.tools", "gpuflow.site_dags")]
    found += [(package, "gpuflow.preflight") for package in ("gpuflow.platform",)
              if "gpuflow.preflight" in packages.get(package, ())]
    return found


def test_no_layer_reaches_up():
    """The platform never imports preflight's rules (their facts' types live in platform/access_facts.py), and
    nothing below the operators imports them (the pool's and the tasks' names: gpuflow.workflow_names)."""
    assert upward_reaches(package_graph(import_graph())) == []


def test_an_upward_reach_is_found():
    packages = {"gpuflow.platform": {"gpuflow.preflight"}, "gpuflow.composer": {"gpuflow.operators"},
                "gpuflow.steps": {"gpuflow.triggers", "gpuflow.tools"}, "gpuflow.dataflow": {"gpuflow.platform"}}
    assert upward_reaches(packages) == [("gpuflow.dataflow", "gpuflow.platform"),
                                        ("gpuflow.composer", "gpuflow.operators"),
                                        ("gpuflow.steps", "gpuflow.triggers"),
                                        ("gpuflow.composer", "gpuflow.operators"),
                                        ("gpuflow.steps", "gpuflow.tools"),
                                        ("gpuflow.platform", "gpuflow.preflight")]
