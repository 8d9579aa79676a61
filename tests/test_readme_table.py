"""The README's benchmark table is the one experiments/readme_table.py generates from the results
files: a figure changes only with its file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_table_is_generated_from_the_results_files():
    spec = importlib.util.spec_from_file_location("readme_table", REPO_ROOT / "experiments" / "readme_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (REPO_ROOT / "README.md").read_text()
    assert module.table() in readme, "README.md's table is stale: python experiments/readme_table.py --write README.md"
    assert readme.count(module.START) == 1 and module.replaced(readme) == readme
