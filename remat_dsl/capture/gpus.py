"""Which shipped device file describes the CUDA GPU this process runs on.

`device_for_gpu(torch.cuda.get_device_name())` names the device file (capture/cost.py,
devices/*.toml) to plan with on that GPU (`plan_model(..., device=NAME)`,
`remat plan --device NAME`): "NVIDIA H100 80GB HBM3" is `h100-sxm`, "NVIDIA A100-SXM4-80GB"
is `a100`.  A GPU is matched by the first pattern of GPUS that finds its name, and gets
the first of that pattern's candidates that ships: each list starts with the file made
for that GPU and goes on with the closest ones, so that a description left out of an
installation (or a user's `shipped` list) falls back to its nearest neighbour.  "Closest" is stated per line: the
same chip in another form factor, else the nearest bf16 matmul peak and memory
bandwidth (datasheet figures, dense).  A GPU no pattern knows gives None: the caller
picks a default and says so.
"""

from __future__ import annotations

import re
from typing import Iterable

from remat_dsl.capture.cost import ALIASES, shipped_devices

# (pattern searched in the lower-cased name, candidates: the GPU's own file first).  The
# first pattern that matches decides, so narrower patterns come before wider ones
# ("gh200" before "h200", "h100 pcie" before "h100").
GPUS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Grace Hopper: the H200's (or H100's) chip and HBM beside a Grace CPU; its host link
    # is NVLink-C2C, far faster than PCIe, which only gh200.toml describes
    (r"\bgh200\b", ("gh200", "h200", "h100-sxm")),
    # H200 SXM and H200 NVL (PCIe card): the H100's compute with 4.8 TB/s of HBM3e; the
    # H100 SXM (same matmul peak, 3.35 TB/s) is the closest other
    (r"\bh200\b", ("h200", "h100-sxm")),
    # H100 PCIe, and H100 NVL (a PCIe card, two bridged): the PCIe host link
    (r"\bh100\b.*\b(pcie|nvl)\b", ("h100-pcie",)),
    # H100 SXM5 ("NVIDIA H100 80GB HBM3"), and the H800: the H100 SXM's chip with less NVLink
    (r"\bh[18]00\b", ("h100-sxm",)),
    # A100 40 GB (SXM4 or PCIe): the 80 GB A100's compute with 1.56 TB/s
    (r"\ba[18]00\b.*\b40\s?gb\b", ("a100-40gb", "a100")),
    # A100 80 GB (SXM4; the PCIe card's 1.94 TB/s is close to the SXM4's 2.04), and the A800
    (r"\ba[18]00\b", ("a100",)),
    # L40S and L40 (Ada, 0.86 TB/s): the A100 is the nearest other in matmul peak and
    # bandwidth (the L4 has a third of the L40S's peak)
    (r"\bl40s?\b", ("l40s", "a100")),
    # RTX 6000 Ada: the L40's chip
    (r"\brtx 6000 ada\b", ("l40s", "a100")),
    (r"\bl4\b", ("l4",)),
    # GeForce RTX 4090 (Ada, 1 TB/s): its own file, else the L40S (the same AD102 chip),
    # else the A100, nearer in peak and bandwidth than the L4
    (r"\brtx 4090\b", ("rtx4090", "l40s", "a100")),
    # GeForce RTX 3060 (Ampere, 0.36 TB/s): its own file, else the L4 (0.3 TB/s)
    (r"\brtx 3060\b", ("rtx3060", "l4")),
)


def device_for_gpu(name: str, shipped: Iterable[str] | None = None) -> str | None:
    """The shipped device name for the GPU `name` (as torch.cuda.get_device_name() gives
    it), or None when no pattern of GPUS knows it.  shipped: the device names to choose
    from (default: the files remat-dsl ships, and their aliases)."""
    available = set(shipped_devices() if shipped is None else shipped)
    available |= {alias for alias, target in ALIASES.items() if target in available}
    text = " ".join(name.lower().replace("-", " ").replace("_", " ").split())
    for pattern, candidates in GPUS:
        if re.search(pattern, text):
            return next((c for c in candidates if c in available), None)
    return None
