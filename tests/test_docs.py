"""The README and the documentation site (mkdocs.yml, docs/): the README stays short and names only paths that
exist in a clone, keeps CI's two commands verbatim, every docs page is in the site's navigation, every relative
link resolves, and the site builds with ``mkdocs build --strict`` (no network: the CLI and API pages are generated
from the click commands and the docstrings)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"
MAX_README_LINES = 250

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
#: a backticked token that names a file or folder of the repository: path characters only, with a slash, or a
#: known file suffix (`docs/json.md`, `.ci/run`, `examples/onnx_mlp.py`, `mkdocs.yml`)
REPO_PATH = re.compile(r"^\.?[A-Za-z0-9_][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)*/?$")
SUFFIXES = (".md", ".py", ".ipynb", ".yml", ".yaml", ".toml", ".csv", ".json", ".png", ".h5")


def _prose(text: str) -> str:
    """Markdown without its fenced code blocks (commands and their output name files they create)."""
    return FENCE.sub("", text)


def _relative_links(text: str) -> list[str]:
    out = []
    for target in LINK.findall(INLINE_CODE.sub("", _prose(text))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page
        out.append(target.split("#", 1)[0])
    return out


def _readme_paths(text: str) -> set[str]:
    paths = set()
    for token in INLINE_CODE.findall(_prose(text)):
        if not REPO_PATH.match(token) or token.startswith("-"):
            continue
        if "/" in token or token.endswith(SUFFIXES):
            paths.add(token)
    return paths


def _nav_pages() -> list[str]:
    """The .md files mkdocs.yml's nav names (read as text: the test suite does not depend on PyYAML)."""
    text = MKDOCS_YML.read_text(encoding="utf-8")
    nav = text[text.index("\nnav:"):]
    return re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w./-]+\.md)\s*$", nav, re.M)


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}; the rest belongs in docs/)"


def test_readme_keeps_the_ci_commands_verbatim():
    """.ci/run runs the README's two commands; they must stay byte-identical in the README."""
    readme = README.read_text(encoding="utf-8")
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert len(ci) == 2, ci
    for line in ci:
        assert f"\n{line}\n" in readme, f"README.md lost CI's command: {line}"


def test_readme_paths_exist():
    """Every relative link and every backticked repository path in the README exists in a clone."""
    readme = README.read_text(encoding="utf-8")
    links = _relative_links(readme)
    paths = _readme_paths(readme)
    assert links and paths  # the README does link into the docs and name files
    missing = sorted({p for p in [*links, *paths] if not (ROOT / p).exists()})
    assert not missing, f"README.md names paths that do not exist: {missing}"
    assert "docs/json.md" in links  # the --json contract is one click away


def test_docs_links_resolve():
    """Relative links between docs pages (and to figures) point at files that exist."""
    broken = []
    for page in sorted(DOCS.rglob("*.md")):
        for target in _relative_links(page.read_text(encoding="utf-8")):
            if target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_in_the_nav():
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), "a page is listed twice in mkdocs.yml's nav"
    missing_files = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing_files, f"mkdocs.yml's nav names pages that do not exist: {missing_files}"
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    orphans = [p for p in pages if p not in nav]
    assert not orphans, f"docs pages missing from mkdocs.yml's nav: {orphans}"
    for required in ("index.md", "layout.md", "architecture.md", "json.md", "reference/cli.md"):
        assert required in nav, required


def test_reference_pages_are_generated_not_copied():
    cli = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert "::: mkdocs-click" in cli and ":module: smdp_batch.cli" in cli and ":command: cli" in cli
    assert ":prog_name: smdp-batch" in cli
    api = "".join(p.read_text(encoding="utf-8") for p in (DOCS / "reference" / "api").glob("*.md"))
    for module in ("smdp_batch", "smdp_batch.model", "smdp_batch.solvers", "smdp_batch.analysis",
                   "smdp_batch.export", "smdp_batch.runtime"):
        assert f"::: {module}" in api, module


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    """`mkdocs build --strict` succeeds offline: every nav page, the generated CLI and API reference."""
    missing = [m for m in ("mkdocs", "material", "mkdocs_click", "mkdocstrings_handlers.python")
               if importlib.util.find_spec(m.split(".")[0]) is None]
    assert not missing, f"the docs build needs {missing}: pip install -e '.[docs]' (the dev extra includes it)"
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(MKDOCS_YML), "-d",
                           str(site)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    for page in _nav_pages():
        stem = page[:-3]
        html = site / (stem[: -len("index")] if stem.split("/")[-1] == "index" else stem + "/") / "index.html"
        assert html.is_file(), f"{page} was not built"
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "smdp-batch solve" in cli and "--slo-p99-ms" in cli  # generated from the click commands
    api = (site / "reference" / "api" / "runtime" / "index.html").read_text(encoding="utf-8")
    assert "DynamicBatcher" in api and "PolicyTable" in api  # generated from the docstrings
