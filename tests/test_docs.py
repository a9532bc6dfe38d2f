"""The README, the docs and CI say the same thing as the code."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    cmds = _readme_commands()
    assert len(cmds) >= 2
    main_job, tests = cmds[0].strip(), cmds[1].strip()
    assert main_job.startswith("pip install .") and "meanfield critical-point" in main_job
    assert "pytest" in tests and "torch==2.13.0" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci, "the README's test command must appear verbatim in .ci/run"
    # the main job in CI differs only by running from a scratch directory
    assert "meanfield critical-point --activation erf" in ci and "meanfield phase-diagram" in ci


def test_relative_links_in_markdown_resolve():
    broken = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"`[^`]*`", "", md.read_text())  # code spans are not links
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            if not (md.parent / target).exists():
                broken.append(f"{md.name} -> {target}")
    assert not broken, broken


#: Markdown files whose ```python blocks a reader copies: each block runs as printed
MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a block that deliberately does not run is preceded by ``<!-- not-run: why -->``; the count is
#: fixed here so that a new marker is a visible change, never a silent skip
NOT_RUN_EXPECTED = 0

_BLOCK = re.compile(r"(?:<!--\s*not-run:(?P<reason>[^>]*)-->\s*\n)?^```python\n(?P<code>.*?)\n```", re.S | re.M)


def _python_blocks(md: Path):
    """(line number, code, not-run reason or None) of every ```python block of ``md``, in order."""
    text = md.read_text()
    return [(text.count("\n", 0, m.start("code")), m.group("code"),
             None if m.group("reason") is None else m.group("reason").strip())
            for m in _BLOCK.finditer(text)]


def test_every_python_block_in_the_docs_runs_or_says_why_not():
    """Every ```python block is run by test_markdown_python_blocks_run or marked not-run with a reason."""
    not_run, blocks = [], 0
    for md in MARKDOWN:
        text = md.read_text()
        assert text.count("```python") == len(_python_blocks(md)), f"{md.name}: a ```python block is not parsed"
        assert text.count("not-run:") == sum(r is not None for _, _, r in _python_blocks(md)), \
            f"{md.name}: a not-run marker is not right before a ```python block"
        for line, _, reason in _python_blocks(md):
            blocks += 1
            if reason is not None:
                assert reason, f"{md.name}:{line}: a not-run marker needs a reason"
                not_run.append(f"{md.name}:{line} ({reason})")
    assert blocks >= 12
    assert len(not_run) == NOT_RUN_EXPECTED, not_run


#: run in a fresh interpreter, as a reader runs a page: the engine choice of meanfield.numeric (CPython
#: until numba is loaded in the process) then does not depend on which tests ran before
_RUN_BLOCKS = """
import json, sys
import matplotlib
matplotlib.use("Agg")
namespace = {"__name__": "__docs__"}
for line, code in json.load(sys.stdin):
    try:
        exec(compile(code, f"{sys.argv[1]}:{line}", "exec"), namespace)
    except Exception as exc:
        sys.exit(f"{sys.argv[1]} block at line {line} failed: {exc!r}\\n{code}")
"""


# slow: the blocks compile architectures and run torch Monte Carlo and AutoInit (from empty compile
# caches the README's take ~45 s and the how-to's ~40 s on a 2-core machine)
@pytest.mark.slow
@pytest.mark.parametrize("md", [pytest.param(md, id=md.name) for md in MARKDOWN if _python_blocks(md)])
def test_markdown_python_blocks_run(md, tmp_path):
    """The ```python blocks of one file run as printed, in order, in one namespace (as a reader pastes them)."""
    import json
    import os

    blocks = [(line, code) for line, code, reason in _python_blocks(md) if reason is None]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # cwd tmp_path: a block that writes a file writes it there
    proc = subprocess.run([sys.executable, "-c", _RUN_BLOCKS, md.name], input=json.dumps(blocks), text=True,
                          capture_output=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_citation_files_cite_the_same_four_papers_as_the_theory_page():
    """CITATION.cff, docs/references.bib and docs/theory.md name the same arXiv ids, one per source paper."""
    arxiv = r"(\d{4}\.\d{4,5})"
    theory = set(re.findall(r"arXiv:" + arxiv, (ROOT / "docs" / "theory.md").read_text()))
    bib = set(re.findall(r"eprint\s*=\s*\{" + arxiv + r"\}", (ROOT / "docs" / "references.bib").read_text()))
    cff = set(re.findall(r'value:\s*"arXiv:' + arxiv + '"', (ROOT / "CITATION.cff").read_text()))
    assert len(theory) == 4 and theory == bib == cff, (theory, bib, cff)
    assert "shared/papers" not in (ROOT / "docs" / "theory.md").read_text()  # not shipped with the package


def test_a_hung_test_fails_the_run(pytestconfig):
    """Issue 27: CI fails on any hang. pytest-timeout (the test extra) is loaded and every test has a bound."""
    assert pytestconfig.pluginmanager.hasplugin("timeout")
    assert 0 < float(pytestconfig.getini("timeout")) <= 3600
