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


@pytest.mark.slow
def test_api_reference_is_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_api.py"), "--check"])
    assert proc.returncode == 0, "docs/api.md is stale: run `python docs/gen_api.py`"


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


@pytest.mark.slow
def test_howto_code_blocks_run():
    """Every ```python block of docs/howto.md runs, in order, in one namespace."""
    blocks = re.findall(r"```python\n(.*?)\n```", (ROOT / "docs" / "howto.md").read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"docs/howto.md[block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            raise AssertionError(f"docs/howto.md block {i} failed: {exc!r}\n{code}") from exc


@pytest.mark.slow
@pytest.mark.torch
def test_readme_python_blocks_all_run_in_order():
    """Every ```python block of the README runs as printed, in order, in one namespace (the
    torch blocks continue the tour: ``arch``, ``mf``); none is skipped."""
    pytest.importorskip("torch")
    import matplotlib

    matplotlib.use("Agg")
    blocks = re.findall(r"```python\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    assert len(blocks) >= 3, "the README's tour, Monte-Carlo and your-model blocks"
    namespace: dict = {}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"README.md[block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            raise AssertionError(f"README.md block {i} failed: {exc!r}\n{code}") from exc
    assert "report" in namespace and "tuned" in namespace
