"""docs/measurements.md is written by the bench scripts (bench/_common.py): replacing one
script's section leaves every other byte as it was, a section without markers is added at
the end, the write is atomic, and every script `make measurements` runs has its markers
(as do the scripts with their own target: `make gpu-check`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from _common import markers, replace_section, write_section  # noqa: E402

DOC = """# Measured figures

Intro.

## One

<!-- begin bench/one.py -->
old one
<!-- end bench/one.py -->

## Two

<!-- begin bench/two.py -->
old two
```
table
```
<!-- end bench/two.py -->

Hand-written text after it.
"""


def test_replacing_one_section_leaves_the_rest_byte_identical():
    new = replace_section(DOC, "bench/two.py", "Two", "`python bench/two.py` on a machine, today.\n\nnew two\n")
    before, after = DOC.split("old two\n```\ntable\n```\n")
    assert new == before + "`python bench/two.py` on a machine, today.\n\nnew two\n" + after
    assert replace_section(new, "bench/one.py", "One", "old one") == new  # the same body: the same bytes
    assert (
        replace_section(replace_section(DOC, "bench/one.py", "One", "x\n"), "bench/one.py", "One", "old one\n") == DOC
    )


def test_a_missing_section_is_added_at_the_end_under_its_title():
    new = replace_section(DOC, "bench/three.py", "Three", "three\n")
    begin, end = markers("bench/three.py")
    assert new == DOC + f"\n## Three\n\n{begin}\nthree\n{end}\n"
    assert replace_section(new, "bench/three.py", "Three", "again") == DOC + f"\n## Three\n\n{begin}\nagain\n{end}\n"


def test_a_lone_or_doubled_marker_is_refused():
    begin, end = markers("bench/one.py")
    with pytest.raises(ValueError, match="bench/one.py"):
        replace_section(DOC.replace(end + "\n", ""), "bench/one.py", "One", "x")
    with pytest.raises(ValueError, match="bench/one.py"):
        replace_section(DOC + f"{begin}\n", "bench/one.py", "One", "x")


def test_write_section_replaces_the_file_atomically(tmp_path):
    doc = tmp_path / "measurements.md"
    doc.write_text(DOC)
    write_section("bench/one.py", "One", "new one\n", doc)
    assert doc.read_text() == DOC.replace("old one\n", "new one\n")
    assert [p.name for p in tmp_path.iterdir()] == ["measurements.md"]  # no temporary file left


# bench scripts that `make measurements` (this CPU machine) does not run, with the target that does
OWN_TARGET = {"bench/gpu_check.py": "gpu-check"}  # needs a CUDA GPU


def test_every_script_make_measurements_runs_has_its_markers():
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^measurements:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert target, "the Makefile has no measurements target"
    scripts = re.findall(r"\s(bench/\w+\.py)", target.group(1))
    assert len(scripts) >= 10, scripts
    doc = (ROOT / "docs" / "measurements.md").read_text()
    for script in scripts:
        assert (ROOT / script).exists(), script
        begin, end = markers(script)
        assert (
            doc.count(begin + "\n") == 1 and doc.count(end + "\n") == 1
        ), f"{script}: no markers in docs/measurements.md"
        assert "--no-write" in (ROOT / script).read_text(), f"{script} has no --no-write"
    assert "make measurements" in doc.split("\n## ")[0], "the doc's head does not say how it is regenerated"
    assert not set(scripts) & set(OWN_TARGET), "a script with its own target is not in make measurements"
    for script, name in OWN_TARGET.items():
        own = re.search(rf"^{name}:.*\n((?:\t.*\n)+)", makefile, re.M)
        assert own and script in own.group(1), f"{script}: no `make {name}` target runs it"
        assert doc.count(markers(script)[0] + "\n") == 1 and doc.count(markers(script)[1] + "\n") == 1, script
        assert "--no-write" in (ROOT / script).read_text(), f"{script} has no --no-write"
    assert sorted(set(scripts) | set(OWN_TARGET)) == sorted(
        f"bench/{p.name}" for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")
    ), "every bench script is in make measurements, or in OWN_TARGET"


def test_plans_do_not_depend_on_the_load(tmp_path):
    """bench/load_independence.py as `make measurements` runs it, on a small model: the plan
    made while every core is busy is the idle one, byte for byte (NOTE: [Load-independent
    costs]); the script exits 1 when they differ."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "load_independence.py"), "tests/models/tiny_cnn.py",
         "--budgets", "80%", "--no-write", "--workdir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "80%: idle" in result.stdout and result.stdout.rstrip().endswith("same"), result.stdout
    idle, loaded = (tmp_path / f"tiny_cnn-80-{run}.plan" for run in ("idle", "loaded"))
    assert idle.read_bytes() == loaded.read_bytes()


def test_whole_step_prints_a_table_per_configuration():
    """bench/whole_step.py on its tiny Llama (fake capture, a few seconds): a table per
    configuration with the columns the docs describe, every strategy a row, and the LoRA
    configuration says that the remat plan was not made for it."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "whole_step.py"), "--tiny", "--no-write"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    heads = [line for line in result.stdout.splitlines() if line.startswith("strategy")]
    assert len(heads) == 2, result.stdout
    columns = ["strategy", "step", "ms", "x", "eager", "device", "peak", "GB", "fits"]
    assert all(head.split() == columns for head in heads), heads
    strategies = ("eager", "recompute only", "ZeRO-Offload", "ZeRO-Infinity", "paged optimizer", "remat plan")
    cells = r" +(-|[0-9][0-9,.]*) +(-|[0-9.]+) +(-|[0-9][0-9,.e-]*) +(yes|no|-)(?: |$)"  # time, ratio, peak, fits
    row = {s: re.compile(f"^{s}{cells}") for s in strategies}
    for strategy in strategies:
        rows = [line for line in result.stdout.splitlines() if row[strategy].match(line)]
        assert len(rows) == 2, (strategy, result.stdout)
    first, lora = result.stdout.split("tiny-lora-rtx3060:")
    remat = next(row["remat plan"].match(line) for line in first.splitlines() if row["remat plan"].match(line))
    assert remat.group(1) != "-" and remat.group(4) == "yes", remat.string  # the tiny model fits: a plan
    assert "2 of 2 layers" in first, result.stdout
    planned = next(row["remat plan"].match(line) for line in lora.splitlines() if row["remat plan"].match(line))
    assert planned.group(1) != "-" and planned.group(4) == "yes", planned.string  # planned from peft's model
    assert "0/8 parameters updated" in planned.string  # the 8 adapters (2 layers x q, v x A, B), not the base
    eager = next(row["eager"].match(line) for line in first.splitlines() if row["eager"].match(line))
    assert eager.group(2) == "1.00", eager.string
