"""The size budgets of docs/design.md hold for the package: modules <= 500 lines, functions <= 60
(tools/budgets.py); and the checker itself finds an over-long function."""

import os
import sys

from tests.helpers.common import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))

import budgets  # noqa: E402


def test_the_package_is_within_its_size_budgets():
    assert budgets.over_budget(os.path.join(REPO_ROOT, "comlrl")) == []


def test_the_checker_finds_an_over_long_function_and_module(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(budgets.FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n" + "\n" * budgets.MODULE_LINES)
    found = budgets.over_budget(str(tmp_path))
    assert [(what, lines) for _path, what, lines in found] == [
        ("module", budgets.MODULE_LINES + budgets.FUNCTION_LINES + 1), ("long()", budgets.FUNCTION_LINES + 1)]
