"""examples/train.py as a user launches it (issue 12 part 5): one process and torchrun with
2 gloo processes; the losses of the generated module equal eager's at every step, the
loss-curve PNG is written, and the measured peak equals the plan's prediction."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["python", "torchrun"])
def test_train_example_runs_and_plots(launcher, tmp_path):
    prefix = f"{BIN}/torchrun --nproc-per-node 2" if launcher == "torchrun" else sys.executable
    command = f"{prefix} {ROOT}/examples/train.py --steps 6 --workdir {tmp_path}/out"
    result = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "losses identical at every step: yes" in result.stdout
    png = tmp_path / "out" / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    measured, predicted = re.search(r"plan ([\d,]+) B \(predicted ([\d,]+) B\)", result.stdout).groups()
    assert measured == predicted
