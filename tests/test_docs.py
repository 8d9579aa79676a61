"""The API reference (mkdocs.yml, docs/): it covers every public name of both packages, and it builds with
no warning (`mkdocs build --strict`, the `docs` extra; the test extra carries it, so CI builds it)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pauliprop
import stabilizer

ROOT = Path(__file__).resolve().parent.parent
# public names provided on first use by the package's __getattr__ (an optional dependency), documented at home
HOMES = {"pauliprop.Estimator": "pauliprop.estimator.Estimator",
         "stabilizer.SinterSampler": "stabilizer.sinter_sampler.SinterSampler"}


def _documented(package) -> set:
    page = (ROOT / "docs" / "api" / f"{package.__name__}.md").read_text()
    return set(re.findall(r"^::: (\S+)$", page, re.M))


@pytest.mark.parametrize("package", [pauliprop, stabilizer], ids=lambda p: p.__name__)
def test_every_public_name_has_its_entry_and_nothing_else(package):
    public = {f"{package.__name__}.{name}" for name in package.__all__}
    if package is pauliprop:
        public.add("pauliprop.Estimator")
    assert _documented(package) == {HOMES.get(name, name) for name in public}


def test_the_reference_builds_without_warnings(tmp_path):
    pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra (mkdocs, mkdocstrings[python])")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    out = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for package in ("pauliprop", "stabilizer"):
        html = (tmp_path / "site" / "api" / package / "index.html").read_text()
        for name in getattr(sys.modules[package], "__all__"):
            assert f'id="{HOMES.get(f"{package}.{name}", f"{package}.{name}")}"' in html, name
