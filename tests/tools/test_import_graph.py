"""No import cycles and no upward arrows in ``comlrl`` (tools/import_graph.py: every import statement
counts, at module level or inside a function), and the tool itself finds what it should."""

import os
import subprocess
import sys

import pytest

from tests.helpers.common import REPO_ROOT

ROOT = REPO_ROOT
sys.path.insert(0, os.path.join(ROOT, "tools"))

import import_graph  # noqa: E402


@pytest.fixture(scope="module")
def edges():
    return import_graph.graph(ROOT)


def test_no_cycles_between_modules(edges):
    assert import_graph.cycles(edges) == []


def test_no_cycles_between_packages(edges):
    assert import_graph.package_cycles(edges) == []


def test_no_upward_arrows(edges):
    assert [str(e) for e in import_graph.upward(edges)] == []


def test_every_package_has_a_layer(edges):
    for edge in edges:
        for module in (edge.source, edge.target):
            import_graph.level(import_graph.layer_package(module))  # raises for a package in no layer


def test_envs_import_nothing_of_the_training_stack(edges):
    reached = {import_graph.layer_package(e.target) for e in edges if import_graph.layer_package(e.source) == "envs"}
    assert reached <= {"envs", "adapters"}


def _package(tmp_path, files):
    for path, text in files.items():
        target = tmp_path / "comlrl" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(tmp_path)


def test_function_level_imports_count_and_cycles_are_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/a.py": "def f():\n    from comlrl.core.b import g\n    return g\n",
        "core/b.py": "from . import a\n",
        "models/__init__.py": "",
        "models/m.py": "import comlrl.core.a\n",
        "cli/__init__.py": "",
        "cli/x.py": "from comlrl.models import m\n",
        "envs/__init__.py": "",
        "envs/e.py": "def late():\n    from comlrl.trainers import t\n",
        "trainers/__init__.py": "",
        "trainers/t.py": "if False:\n    from comlrl.cli.x import y\n",
    })
    edges = import_graph.graph(root)
    assert ("comlrl.core.a", "comlrl.core.b") in {(e.source, e.target) for e in edges}  # inside a function
    assert ("comlrl.core.b", "comlrl.core.a") in {(e.source, e.target) for e in edges}  # relative
    assert ("comlrl.cli.x", "comlrl.models.m") in {(e.source, e.target) for e in edges}  # a submodule by name
    assert import_graph.cycles(edges) == [["comlrl.core.a", "comlrl.core.b"]]
    assert sorted(str(e).split("  ")[0] for e in import_graph.upward(edges)) == [
        "comlrl.envs.e -> comlrl.trainers.t", "comlrl.trainers.t -> comlrl.cli.x"]
    assert import_graph.package_cycles(edges) == []


def test_the_command_reports_and_fails_on_a_cycle(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "core/__init__.py": "", "core/a.py": "import comlrl.core.b\n",
                               "core/b.py": "def f():\n    import comlrl.core.a\n"})
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "import_graph.py"), "--root", root],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "comlrl.core.a <-> comlrl.core.b" in bad.stdout
    good = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "import_graph.py")], capture_output=True, text=True)
    assert good.returncode == 0, good.stdout
    assert "module cycles: 0" in good.stdout and "upward arrows: 0" in good.stdout
