"""The optimizer a plan's step runs: its header line, the memory it holds and its time.

NOTE: [Optimizer in the step]
A plan whose header names an optimizer covers the whole training step: forward, backward
and the update of every trainable parameter, each placed where its gradient is complete
and after the last read of the parameter (X. Zhao, "Optimizing Memory Usage when Training
Deep Neural Networks", PhD thesis, Université de Bordeaux, 2024, ch. 4, eq. 4.6: a
parameter is optimized in the stage where its last gradient is made).  The header line is

    optimizer  "adamw lr=0.001 beta1=0.9 beta2=0.999 eps=1e-08 weight_decay=0.01"

one kind of KINDS and its hyper-parameters, every one written out (the printer writes
the defaults too, so a plan says exactly what runs).  `update P` runs P's update on the
device (its optimizer states live on the device for the whole step); `host_update P`
runs it on the host from the host copy of P's gradient (offloaded before) with the
optimizer states and an fp32 master copy of P kept in host memory, and then copies P back
to the device on the h2d stream (eq. 4.18-4.23: host memory, host update time).  A
device update may also page its states (NOTE: [Paged optimizer states]), and may update a
parameter kept in host memory, on its device copy, which is then written back (NOTE:
[Parameters on the host] in remat_dsl/check/replay.py).

Memory, per parameter of `nbytes` bytes (its dtype's bytes; states have the parameter's
dtype, as torch.optim makes them):
- states: Adam, AdamW: 2 x nbytes (exp_avg, exp_avg_sq); SGD: nbytes with momentum, 0
  without.  torch.optim's 4-byte step counter is left out.
- temporaries of one update, as torch.optim's single-tensor code allocates them:
  AdamW: 2 x nbytes (`exp_avg_sq.sqrt() / bias_correction2_sqrt`); Adam: 2 x nbytes, and
  one more with weight decay (`grad.add(param, alpha=weight_decay)` lives through the
  update); SGD: nbytes with weight decay, nbytes with Nesterov momentum, the two at once
  at most 2 x nbytes.
Time: nbytes / the header's update speed (device or host, bytes of parameter per second),
plus, once a step on the host, its management time (eq. 4.23's H).

NOTE: [Paged optimizer states]
A device update whose states do not fit beside the step's other memory can page them: P's
states live in host memory (as a host update's do) and are copied to the device for the
update only,

    prefetch_states P      h2d: allocate P's states on the device, copy them in
    wait_states P          the compute stream waits for that copy
    update P               on the device, as an unpaged update
    offload_states P       d2h: copy the new states back to host memory
    wait_states P          the compute stream waits for that copy; the device copy is freed

(X. Zhao's thesis, ch. 4, eq. 4.10: the O-ILP's PrfO and OflO, the prefetch and the offload
of a parameter's optimizer states, and eq. 4.21-4.22: they run on the h2d and d2h channels
and their device memory is counted from the prefetch to the end of the offload).  The states
keep the parameter's dtype, so the host holds state_bytes(P) for the whole step; the link
carries them twice a step, against a host update's gradient offload, master update at the
host's speed and parameter copy back.  Each line is once per paged parameter; a plan that
leaves paged states on the device, updates them before they arrive or offloads them before
the update is refused (remat_dsl/check/replay.py).

Hyper-parameters are numbers only, and the kind one of KINDS: nothing in a plan's
optimizer line names code to run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# kind -> (the torch.optim class the generated module builds, hyper-parameters with their
# torch.optim defaults, in the order the printer writes them)
KINDS: dict[str, tuple[str, tuple[tuple[str, float], ...]]] = {
    "adamw": ("AdamW", (("lr", 0.001), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-08), ("weight_decay", 0.01))),
    "adam": ("Adam", (("lr", 0.001), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-08), ("weight_decay", 0.0))),
    "sgd": (
        "SGD",
        (("lr", 0.001), ("momentum", 0.0), ("dampening", 0.0), ("weight_decay", 0.0), ("nesterov", 0.0)),
    ),
}
# Bytes of the scalar tensors (an int64 and a float32 wrapped number) torch.optim's
# single-tensor Adam, AdamW and SGD with momentum (not Nesterov) hold beside their
# temporaries at the peak of an update on a CPU, measured with the profiler's allocator
# events (torch 2.13): 32780 B for AdamW on a 16 KiB parameter, 2 x 16384 + 12.
CPU_SCALAR_BYTES = 12
# torch.optim classes a user may pass, by class name -> kind
CLASSES = {cls: kind for kind, (cls, _) in KINDS.items()}
_WORD = re.compile(r"^[a-z_][a-z0-9_]*$")
_NUMBER = re.compile(r"^-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$")


class OptimizerError(ValueError):
    """A bad optimizer line or option: the message says what was expected."""


@dataclass(frozen=True)
class Optimizer:
    """An optimizer with every hyper-parameter (NOTE: [Optimizer in the step]).

    kind: one of KINDS.  hyper: (name, value) in KINDS' order, floats (nesterov 0 or 1).
    """

    kind: str
    hyper: tuple[tuple[str, float], ...]

    @property
    def values(self) -> dict[str, float]:
        return dict(self.hyper)

    def text(self) -> str:
        """The header's text: `adamw lr=0.001 beta1=0.9 ...` (repr of each float: exact)."""
        return " ".join([self.kind, *(f"{name}={_number(value)}" for name, value in self.hyper)])

    def torch_kwargs(self) -> dict[str, object]:
        """The keyword arguments of the torch.optim class (KINDS) that runs this optimizer."""
        v = self.values
        if self.kind in ("adam", "adamw"):
            return dict(lr=v["lr"], betas=(v["beta1"], v["beta2"]), eps=v["eps"], weight_decay=v["weight_decay"])
        return dict(
            lr=v["lr"],
            momentum=v["momentum"],
            dampening=v["dampening"],
            weight_decay=v["weight_decay"],
            nesterov=bool(v["nesterov"]),
        )

    @property
    def state_tensors(self) -> int:
        """How many tensors of its parameter's shape and dtype torch.optim keeps per
        parameter: Adam, AdamW 2 (exp_avg, exp_avg_sq); SGD 1 with momentum, else 0."""
        if self.kind in ("adam", "adamw"):
            return 2
        return 1 if self.values["momentum"] else 0

    def state_bytes(self, nbytes: int) -> int:
        """Bytes of optimizer state a parameter of `nbytes` bytes holds."""
        return self.state_tensors * nbytes

    def temp_bytes(self, nbytes: int, cpu: bool = False) -> int:
        """Bytes one update of a parameter of `nbytes` bytes allocates and frees at its
        peak; `cpu`: the update runs on a CPU, where torch.optim's scalar operands are
        tensors of the same allocator (CPU_SCALAR_BYTES)."""
        v = self.values
        if self.kind == "adamw":
            temp = 2 * nbytes
        elif self.kind == "adam":
            temp = (3 if v["weight_decay"] else 2) * nbytes
        else:
            temp = (int(bool(v["weight_decay"])) + int(bool(v["nesterov"]))) * nbytes
        scalars = self.kind != "sgd" or (v["momentum"] and not v["nesterov"])
        return temp + (CPU_SCALAR_BYTES if cpu and scalars else 0)


# Bytes of memory traffic per byte of parameter in one update: AdamW and Adam read the
# parameter, its gradient and two states and write three back, and write and read the two
# temporaries of the denominator (11); SGD with momentum reads the parameter, the gradient
# and the buffer and writes two back (5).
TRAFFIC = {"adamw": 11, "adam": 11, "sgd": 5}


def device_update_speed(kind: str, memory_bandwidth: float) -> int:
    """Bytes of parameter a device updates per second: its memory bandwidth (bytes/s, as
    reached by streaming kernels) over the update's traffic per parameter byte (TRAFFIC),
    rounded down to whole MB/s."""
    return max(10**6, int(memory_bandwidth / TRAFFIC[kind]) // 10**6 * 10**6)  # whole MB/s: printed in GB/s


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)


def parse_optimizer(text: str) -> Optimizer:
    """`KIND [NAME=NUMBER ...]` (an optimizer header or `--optimizer` option) as an Optimizer,
    with KINDS' defaults for the hyper-parameters it leaves out.

    Raises OptimizerError naming the word that is wrong and what was expected."""
    words = text.split()
    if not words:
        raise OptimizerError(f"expected an optimizer ({', '.join(KINDS)}), got nothing")
    kind = words[0].lower()
    if kind not in KINDS:
        raise OptimizerError(
            f"unknown optimizer '{words[0][:40]}': remat-dsl plans {', '.join(KINDS)} (AdamW, Adam, SGD with "
            "momentum); other optimizers are not supported"
        )
    defaults = dict(KINDS[kind][1])
    given: dict[str, float] = {}
    for word in words[1:]:
        name, eq, value = word.partition("=")
        name = name.replace("-", "_")
        if not eq or not _WORD.match(name) or not _NUMBER.match(value):
            raise OptimizerError(f"expected NAME=NUMBER after '{kind}', got '{word[:40]}'")
        if name == "betas":
            raise OptimizerError("'betas' is written as two hyper-parameters: beta1=NUMBER beta2=NUMBER")
        if name in ("amsgrad", "maximize"):
            raise OptimizerError(f"{kind} with {name} is not planned: remat-dsl plans the update without it")
        if name in ("foreach", "fused", "capturable", "differentiable"):
            raise OptimizerError(f"'{name}' chooses an implementation, not a hyper-parameter: leave it out")
        if name not in defaults:
            raise OptimizerError(f"'{name}' is not a hyper-parameter of {kind} (expected {', '.join(defaults)})")
        if name in given:
            raise OptimizerError(f"'{name}' is given twice")
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise OptimizerError(f"{name}={value}: expected a finite number >= 0")
        given[name] = number
    hyper = {**defaults, **given}
    if kind == "sgd" and hyper["nesterov"] not in (0.0, 1.0):
        raise OptimizerError("nesterov is 0 or 1")
    if kind == "sgd" and hyper["nesterov"] and (not hyper["momentum"] or hyper["dampening"]):
        raise OptimizerError("Nesterov momentum needs momentum > 0 and dampening 0 (as torch.optim.SGD)")
    if kind != "sgd" and not (hyper["beta1"] < 1 and hyper["beta2"] < 1):
        raise OptimizerError("beta1 and beta2 must be below 1")
    return Optimizer(kind, tuple(hyper.items()))


def from_torch(optimizer) -> Optimizer:
    """The Optimizer of a torch.optim instance (its class one of CLASSES' names).

    With several parameter groups, the plan's header names the group whose update costs the
    most memory (weight decay on, for Adam's temporaries; momentum on, for SGD's buffer): the
    plan's memory then holds for every group, and the generated module runs each group with
    its own hyper-parameters (NOTE: [Optimizer in the step]).  Raises OptimizerError for
    another class, or a group with options remat-dsl does not plan (amsgrad, maximize)."""
    name = type(optimizer).__name__
    if name not in CLASSES:
        raise OptimizerError(f"{name} is not an optimizer remat-dsl plans ({', '.join(CLASSES)})")
    kind = CLASSES[name]
    for number, each in enumerate(optimizer.param_groups):
        if each.get("amsgrad") or each.get("maximize"):
            raise OptimizerError(
                f"{name} with amsgrad or maximize (parameter group {number}) is not planned: remat-dsl plans the "
                "update without them"
            )
    group = max(
        optimizer.param_groups,
        key=lambda each: (float(each.get("weight_decay", 0.0)) != 0.0, float(each.get("momentum", 0.0)) != 0.0),
    )
    if kind in ("adam", "adamw"):
        words = [f"lr={float(group['lr'])!r}", f"beta1={float(group['betas'][0])!r}"]
        words += [f"beta2={float(group['betas'][1])!r}", f"eps={float(group['eps'])!r}"]
        words += [f"weight_decay={float(group['weight_decay'])!r}"]
    else:
        words = [f"lr={float(group['lr'])!r}", f"momentum={float(group['momentum'])!r}"]
        words += [f"dampening={float(group['dampening'])!r}", f"weight_decay={float(group['weight_decay'])!r}"]
        words += [f"nesterov={int(bool(group['nesterov']))}"]
    return parse_optimizer(" ".join([kind, *words]))
