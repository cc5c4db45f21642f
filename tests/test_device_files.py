"""The shipped device files (remat_dsl/capture/devices/*.toml) cite a source for every figure.

Each file's header comment defines its sources as tags, `("datasheet")` after the
document's title; each `key = value` line's comment names one of them or says ASSUMPTION
(with its reason).  cpu.toml's figures are calibrated on this machine: their comments say
fitted, measured or calibrated instead.  Every GPU file gives `multiprocessors`, and its
host link figures (the offload bandwidth) each name a source, measured where one is
published (docs/devices.md, "Shipped devices").  Every file gives the host CPU's optimizer
speed and management time (`host_update`, `host_update_overhead`: OffMate's alpha_C and H),
cited or marked ASSUMPTION like any figure.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from remat_dsl.capture.cost import ALIASES, DEVICES, load_device, shipped_devices

SHIPPED = ("a100", "a100-40gb", "cpu", "gh200", "h100-pcie", "h100-sxm", "h200", "l4", "l40s", "rtx3060", "rtx4090")
TAG = re.compile(r'\("([A-Za-z][\w.-]*)"\)')
KEY_LINE = re.compile(r"^\s*([A-Za-z_][\w]*)\s*=\s*([^#]*?)\s*(?:#\s*(.*))?$")
HOST_KEYS = ("host_to_device", "device_to_host", "host_update", "host_update_overhead")
CALIBRATED = re.compile(r"\b(fitted|measured|calibrated)\b", re.IGNORECASE)


def header_tags(text: str) -> set[str]:
    """The tags that the file's leading comment block defines."""
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    return set(TAG.findall("\n".join(header)))


def figure_lines(text: str) -> list[tuple[int, str, str, str]]:
    """(line number, key, value, comment) of every `key = value` line with a number."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith(("#", "[")):
            continue
        match = KEY_LINE.match(line)
        if match and not match.group(2).startswith('"'):
            found.append((number, match.group(1), match.group(2), match.group(3) or ""))
    return found


def names_a_tag(comment: str, tags: set[str]) -> bool:
    return any(re.search(rf"(?<![\w-]){re.escape(tag)}(?![\w-])", comment) for tag in tags)


def uncited(path: Path) -> list[str]:
    """Every line of the device file at `path` that breaks the rules above, as
    `FILE:LINE: why` (empty: the file is fine)."""
    text = path.read_text(encoding="utf-8")
    tags = header_tags(text)
    problems = []
    if path.stem != "cpu" and not tags:
        problems.append(f'{path.name}:1: the header comment defines no source tag like ("datasheet")')
    figures = figure_lines(text)
    for number, key, _value, comment in figures:
        where = f"{path.name}:{number}: `{key}`"
        if path.stem == "cpu":
            if not CALIBRATED.search(comment):
                problems.append(f"{where} says neither fitted, measured nor calibrated")
            continue
        if key in ("host_to_device", "device_to_host") and not names_a_tag(comment, tags):
            problems.append(f"{where} names no source tag of the header (a host link is always cited)")
        elif "ASSUMPTION" not in comment and not names_a_tag(comment, tags):
            problems.append(f"{where} names no source tag of the header ({', '.join(sorted(tags))}) nor ASSUMPTION")
    keys = {key for _number, key, _value, _comment in figures}
    if path.stem != "cpu" and "multiprocessors" not in keys:
        problems.append(f"{path.name}: a GPU file without `multiprocessors`")
    for key in HOST_KEYS:
        if key not in keys:
            problems.append(f"{path.name}: no `{key}`")
    return problems


def test_the_shipped_devices():
    assert shipped_devices() == SHIPPED
    assert all(name in SHIPPED for name in ALIASES.values())


@pytest.mark.parametrize("name", SHIPPED)
def test_every_figure_cites_its_source(name):
    path = DEVICES / f"{name}.toml"
    device = load_device(name)
    assert device.name == name
    assert uncited(path) == []
    if device.kind == "cuda":
        assert device.multiprocessors > 0
    assert all(len(line) <= 120 for line in path.read_text(encoding="utf-8").splitlines())


def test_a_figure_without_a_source_fails(tmp_path):
    """The checks can fail: copies with a figure's citation removed, a tag that the header
    does not define, an assumed host link, and no multiprocessors, each caught."""
    text = (DEVICES / "h100-sxm.toml").read_text(encoding="utf-8")

    def problems(old: str, new: str) -> list[str]:
        """What `uncited` says of a copy with `old` replaced by `new`, without FILE:LINE."""
        assert old in text
        path = tmp_path / "h100-sxm.toml"
        path.write_text(text.replace(old, new), encoding="utf-8")
        load_device(str(path))  # still a valid device file: only the citation is wrong
        return [problem.split(": ", 1)[1] for problem in uncited(path)]

    tags = "(datasheet, nvbandwidth-24, thesis, whitepaper)"
    assert problems("# bytes; datasheet: GPU memory 80 GB", "# bytes") == [
        f"`memory` names no source tag of the header {tags} nor ASSUMPTION"
    ]
    assert problems("datasheet: FP64 34 TFLOPS", "spec: FP64 34 TFLOPS") == [
        f"`float64` names no source tag of the header {tags} nor ASSUMPTION"
    ]
    host_link = "names no source tag of the header (a host link is always cited)"
    assert problems("# bytes/s; nvbandwidth-24: device_to_host_memcpy_sm", "# bytes/s; ASSUMPTION: about") == [
        f"`device_to_host` {host_link}"
    ]
    assert problems('("nvbandwidth-24")', '("nvbw")') == [
        f"`host_to_device` {host_link}",
        f"`device_to_host` {host_link}",
    ]
    assert problems("multiprocessors = 132 ", "# multiprocessors = 132 ") == ["a GPU file without `multiprocessors`"]
    assert problems("# ASSUMPTION: cuDNN convolutions", "# cuDNN convolutions") == [
        f"`conv_efficiency` names no source tag of the header {tags} nor ASSUMPTION"
    ]
    assert problems("# bytes/s; ASSUMPTION: thesis's 1.1 GB/s", "# bytes/s; 1.1 GB/s") == [
        f"`host_update` names no source tag of the header {tags} nor ASSUMPTION"
    ]
    assert problems("# seconds; ASSUMPTION: thesis's H = 50 ms", "# seconds; H = 50 ms") == [
        f"`host_update_overhead` names no source tag of the header {tags} nor ASSUMPTION"
    ]


@pytest.mark.parametrize("key", ["host_update", "host_update_overhead"])
def test_a_file_without_a_host_update_key_fails(tmp_path, key):
    """Every shipped file gives the host's optimizer figures (the loader requires them too)."""
    for name in ("h100-sxm", "cpu"):
        lines = (DEVICES / f"{name}.toml").read_text(encoding="utf-8").splitlines()
        path = tmp_path / f"{name}.toml"
        path.write_text("\n".join(line for line in lines if not line.startswith(f"{key} ")) + "\n", encoding="utf-8")
        assert [problem.split(": ", 1)[1] for problem in uncited(path)] == [f"no `{key}`"]


def test_cpu_figures_say_they_are_calibrated(tmp_path):
    text = (DEVICES / "cpu.toml").read_text(encoding="utf-8")
    old = "# bytes/s; measured: the same copy"
    assert old in text
    path = tmp_path / "cpu.toml"
    path.write_text(text.replace(old, "# bytes/s; the same copy"), encoding="utf-8")
    assert [problem.split(": ", 1)[1] for problem in uncited(path)] == [
        "`device_to_host` says neither fitted, measured nor calibrated"
    ]


def test_aliases_name_shipped_devices():
    assert load_device("a100-80gb") == load_device("a100")
    assert load_device("h100") == load_device("h100-sxm")
