"""The README's benchmark table and the results page (experiments/README.md) are the ones
experiments/readme_table.py generates from the results files: a figure changes only with its file."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("readme_table", REPO_ROOT / "experiments" / "readme_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_generated_from_the_results_files():
    module = _module()
    readme = (REPO_ROOT / "README.md").read_text()
    assert module.table() in readme, "README.md's table is stale: python experiments/readme_table.py --write README.md"
    assert readme.count(module.START) == 1 and module.replaced(readme) == readme


def test_the_results_page_is_generated_from_the_results_files():
    module = _module()
    page = (REPO_ROOT / "experiments" / "README.md").read_text()
    assert page.count(module.PAGE_START) == 1 and module.page() in page, \
        "experiments/README.md is stale: python experiments/readme_table.py --write-page experiments/README.md"


def test_every_results_file_the_page_names_exists_and_every_command_names_a_script():
    module = _module()
    block = module.page()
    for name in set(re.findall(r"`([\w.-]+\.json)`", block)):
        assert (REPO_ROOT / "experiments" / "results" / name).is_file(), name
    for script in set(re.findall(r"`python (\S+\.py)", block)):
        assert (REPO_ROOT / script).is_file(), script
