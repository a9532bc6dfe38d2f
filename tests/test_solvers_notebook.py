"""notebooks/critical_lines.ipynb runs top to bottom and shows the right numbers."""
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "critical_lines.ipynb"


def _outputs(nb):
    text = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                text.append(out.text)
            elif out.output_type == "execute_result":
                text.append(out.data.get("text/plain", ""))
            elif out.output_type == "error":
                raise AssertionError(f"{out.ename}: {out.evalue}")
    return "\n".join(text)


def test_critical_lines_notebook():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    out = _outputs(nb)
    err = float(re.search(r"max relative difference from eq. 126: (\S+)", out).group(1))
    assert err < 1e-10
    assert "no line below sqrt(pi/4): True" in out
    assert "chi_K at K* = 0, sigma_w^2 = pi/4: 1" in out
    assert "'plain': [(0.8862269255, 0.0)]" in out
    assert "'residual, mu = 0.5': [(0.767495031, 0.0)]" in out      # sqrt(pi (1 - mu^2) / 4)
    assert "ln_pre slope sigma_b/sigma_w: 0.32380" in out
    assert "ln_pre, mu = 1: True" in out
    assert "(sigma_w, sigma_b) = (1.4082110131, 0.4158393810)  K* = 3.5615528128" in out
    assert "(sigma_w, sigma_b) = (2.0000000000, 0.0000000000)  K* = 0.0000000000" in out
    assert "phases on the grid" in out
