"""The chain model of rotor (Beaumont et al., "Optimal checkpointing for heterogeneous
chains", section 3, Fig. 1a, Table 1) and the one replay of a chain sequence.

A `Chain` is L blocks numbered 1..L as in the paper: block l computes a^l from a^{l-1}
(F^l) and delta^{l-1} from delta^l (B^l); a^0 is the chain input.  A `ChainSchedule` is a
sequence of steps `(kind, l)` with l in 1..L.  `simulate_chain` replays a sequence with
exactly the semantics below; it is the ground truth the solvers are tested against.

NOTE: [Step semantics]
Memory holds three kinds of values: a^l (output of block l, or the chain input for l = 0),
abar^l (everything B^l needs from block l, *including* a^l: while abar^l is live, a^l is
available and costs nothing extra) and delta^l (gradient of a^l).  "has a^l" means a^l or
abar^l is live.  A *plain* a^l is one held on its own, not inside abar^l.

initially   a^0 (plain) and delta^L are live.  The loss is folded into block L, so delta^L
            is the given seed gradient (typically a scalar) and counts from the start.
F_all l     needs a^{l-1}; a^l and abar^l must not be live.  Peak during the step: live +
            omega_abar^l + o_f^l.  After: abar^l is live; a^{l-1} is kept.
F_ck l      needs a^{l-1}; a^l and abar^l must not be live.  Peak during the step: live +
            omega_a^l + o_f^l.  After: plain a^l is live; a^{l-1} is kept (the checkpoint).
F_n l       needs a^{l-1}; a^l and abar^l must not be live.  Peak during the step: live +
            omega_a^l + o_f^l.  After: plain a^l is live; a *plain* a^{l-1} is freed (an
            a^{l-1} inside abar^{l-1} stays, it is freed only by B^{l-1}).
B l         needs delta^l, abar^l and a^{l-1}; delta^{l-1} must not be live.  Peak during
            the step: live + omega_delta^{l-1} + o_b^l.  After: delta^{l-1} is live;
            delta^l and abar^l are freed, and so is a *plain* a^{l-1} (checkpoint consumed;
            an a^{l-1} inside abar^{l-1} stays for B^{l-1}); g^l is live from then on.
finally     only delta^0 may be live (B^1 frees a^0), and every B^l ran exactly once.

NOTE: [Kept gradients]
The paper's chain returns only delta^0; a training step also returns every parameter's
gradient.  B^l makes the gradients of block l's parameters, omega_g^l bytes (`kept_bytes`),
and they stay to the end of the step, so while B^s runs the kept gradients of every block
after s are live.  (A partial gradient that an earlier block's backward reads, such as a
tied embedding's, lives only until then; the chain does not count it, see
remat_dsl.solve.solvers.chain.partition._kept.)  The solvers count them
(remat_dsl.solve.solvers.chain.rotor, NOTE: [Memory conditions]):
a chain of 8 decoder layers ends holding 98 MiB of them at a budget of 139 MiB,
which a model that ignores them meets only by planning every block for the last one's
memory (the driver's budget correction, remat_dsl.solve.driver).  With kept_bytes = 0
everywhere this is the paper's model exactly (`uncounted`).

NOTE: [Two chain models]
Counting the kept gradients makes the chain exact about them, not about everything: a
block's saved tensors are held through its whole B step, though the backward frees them
as it goes, and tensors that cross blocks (a U-Net's skips, a Transformer's encoder output,
a model's outputs) are not counted at all.  On a chain of decoder layers
the counted model plans faster (8 Llama layers at 40%: 1.128 -> 1.109 of the time of every
op once); where those other errors dominate, the paper's model, whose errors partly cancel,
reached smaller budgets (GPT-2's rockmate 30.4% -> 29.9%, U-Net's rotor 51.9% -> 48.2%).
So the chain solvers plan with the counted model and fall back on the paper's
(`fallbacks`, `gradients=uncounted` in the plan header) for a budget it cannot meet: the
smallest feasible budget is the least of the two.

These are Table 1's rows: F_all and F_ck keep their input, F_n and B consume a plain input.
The peak of a sequence is the largest "peak during the step" (Definition 3.4); its time is
the sum of u_f^l for every forward step and u_b^l for every backward step (Definition 3.2).
A lowering translates: F_all = run the block with autograd recording, from a^{l-1}
detached with requires_grad; F_ck = run under no_grad and keep the input; F_n = run under
no_grad and drop the input unless it belongs to a recorded graph; B = backward through the
recorded graph of block l with delta^l, read delta^{l-1}, then drop the graph and the input.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

STEP_KINDS = ("F_all", "F_ck", "F_n", "B")
FORWARD_KINDS = ("F_all", "F_ck", "F_n")

ChainOp = tuple  # (kind, l) or (kind, l, o): kind in STEP_KINDS, block l in 1..L, option o


@dataclass(frozen=True)
class BlockOption:
    """Another way to run F_all^l / B^l (RK-Rotor's option o > 0, thesis section 2.5.1):
    F_all^o keeps `xbar_bytes` (a^l and the saved tensors of this option) with transient
    `fwd_overhead`; B^o recomputes what was not kept, taking `bwd_us` and `bwd_overhead`.
    `index` names the option for the caller (the position in its own list of schedules)."""

    xbar_bytes: int
    fwd_overhead: int
    bwd_us: int
    bwd_overhead: int
    index: int


@dataclass(frozen=True)
class Block:
    """One stage l of the chain (rotor's notation, section 3.1); bytes and microseconds.

    Raises ValueError when a field is not a non-negative int or xbar_bytes < x_bytes
    (abar^l contains a^l, so it cannot be smaller).
    """

    fwd_us: int  # u_f^l, time of F^l (microseconds)
    bwd_us: int  # u_b^l, time of B^l
    x_bytes: int  # omega_a^l: size of the block's output a^l (the next block's input)
    xbar_bytes: int  # omega_abar^l: memory kept by F_all^l (all tensors B^l needs, with a^l)
    grad_bytes: int  # omega_delta^l: size of delta^l, the gradient of a^l
    fwd_overhead: int  # o_f^l: extra transient memory while running F^l
    bwd_overhead: int  # o_b^l: extra transient memory while running B^l
    options: tuple[BlockOption, ...] = ()  # RK-Rotor's options beyond store-all (o = 1..)
    kept_bytes: int = 0  # omega_g^l: what B^l makes that stays to the step's end (NOTE: [Kept gradients])

    def variant(self, o: int) -> tuple[int, int, int, int]:
        """(xbar_bytes, fwd_overhead, bwd_us, bwd_overhead) of F_all^o / B^o; o = 0 is
        store-all (the block's own fields)."""
        if o == 0:
            return self.xbar_bytes, self.fwd_overhead, self.bwd_us, self.bwd_overhead
        opt = self.options[o - 1]
        return opt.xbar_bytes, opt.fwd_overhead, opt.bwd_us, opt.bwd_overhead

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "options":
                continue
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Block.{f.name} must be a non-negative int, got {value!r}")
        if self.xbar_bytes < self.x_bytes:
            raise ValueError(
                f"Block.xbar_bytes ({self.xbar_bytes}) < x_bytes ({self.x_bytes}): "
                "abar^l contains a^l, so it is at least as large"
            )


@dataclass(frozen=True)
class Chain:
    """A chain of L >= 1 blocks plus the sizes of the chain input a^0 and its gradient."""

    blocks: tuple[Block, ...]
    input_bytes: int  # omega_a^0, size of a^0
    input_grad_bytes: int  # omega_delta^0 (0 when the input needs no gradient)

    def __post_init__(self) -> None:
        if not self.blocks:
            raise ValueError("a Chain needs at least one block")
        for name in ("input_bytes", "input_grad_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Chain.{name} must be a non-negative int, got {value!r}")

    @property
    def length(self) -> int:
        return len(self.blocks)

    def a_bytes(self, l: int) -> int:
        """omega_a^l for l in 0..L."""
        return self.input_bytes if l == 0 else self.blocks[l - 1].x_bytes

    def delta_bytes(self, l: int) -> int:
        """omega_delta^l for l in 0..L."""
        return self.input_grad_bytes if l == 0 else self.blocks[l - 1].grad_bytes


@dataclass(frozen=True)
class ChainSchedule:
    """A chain sequence and what the solver predicts for it.

    `predicted_us`: makespan (microseconds) according to the solver; `predicted_peak`: peak
    bytes of `simulate_chain(chain, ops)` (the undiscretized model).
    """

    ops: tuple[ChainOp, ...]
    predicted_us: int
    predicted_peak: int


class InfeasibleBudget(Exception):
    """No sequence of the solver fits `budget` bytes; `smallest_feasible` (bytes) does."""

    def __init__(self, budget: int, smallest_feasible: int):
        self.budget = budget
        self.smallest_feasible = smallest_feasible
        super().__init__(
            f"no rematerialization sequence fits in a budget of {budget} bytes; "
            f"the smallest feasible budget is {smallest_feasible} bytes"
        )


class InvalidChainSequence(ValueError):
    """A sequence breaks the step semantics of NOTE: [Step semantics]."""


def uncounted(chain: Chain) -> Chain:
    """`chain` without its kept gradients: the paper's model (NOTE: [Two chain models])."""
    return replace(chain, blocks=tuple(replace(b, kept_bytes=0) for b in chain.blocks))


def simulate_chain(chain: Chain, ops) -> tuple[int, int]:
    """Replay `ops` on `chain`: (peak bytes, total microseconds); kept gradients count from
    their B step on (NOTE: [Kept gradients]).

    Applies exactly NOTE: [Step semantics] (paper section 3.1, Table 1, Definitions
    3.2-3.4).  Raises InvalidChainSequence (a ValueError) naming the first offending step.
    """
    L = chain.length
    acts: dict = {0: "a"}  # l -> "a" (plain a^l) or ("abar", o) (abar^l of option o, holds a^l)
    grads = {L}
    live = chain.input_bytes + chain.delta_bytes(L)
    peak, total = live, 0
    for i, op in enumerate(ops):
        kind, l, *rest = op
        o = rest[0] if rest else 0
        where = f"step {i} {op}"
        if kind not in STEP_KINDS:
            raise InvalidChainSequence(f"{where}: unknown step kind, expected one of {STEP_KINDS}")
        if not isinstance(l, int) or not 1 <= l <= L:
            raise InvalidChainSequence(f"{where}: block index must be in 1..{L}")
        block = chain.blocks[l - 1]
        if not 0 <= o <= len(block.options):
            raise InvalidChainSequence(f"{where}: block {l} has no option {o}")
        xbar, fwd_overhead, bwd_us, bwd_overhead = block.variant(o)
        if l - 1 not in acts:
            raise InvalidChainSequence(f"{where}: input a^{l - 1} is not live")
        if kind in FORWARD_KINDS:
            if l in acts:
                raise InvalidChainSequence(f"{where}: a^{l} is already live")
            out = xbar if kind == "F_all" else block.x_bytes
            peak = max(peak, live + out + (fwd_overhead if kind == "F_all" else block.fwd_overhead))
            live += out
            acts[l] = ("abar", o) if kind == "F_all" else "a"
            if kind == "F_n" and acts[l - 1] == "a":
                live -= chain.a_bytes(l - 1)
                del acts[l - 1]
            total += block.fwd_us
            continue
        if l not in grads:
            raise InvalidChainSequence(f"{where}: delta^{l} is not live")
        if acts.get(l) != ("abar", o):
            raise InvalidChainSequence(f"{where}: abar^{l} is not live with option {o} (run F_all {l} with it first)")
        if l - 1 in grads:
            raise InvalidChainSequence(f"{where}: delta^{l - 1} is already live")
        peak = max(peak, live + chain.delta_bytes(l - 1) + bwd_overhead)
        live += chain.delta_bytes(l - 1) - chain.delta_bytes(l) - xbar + block.kept_bytes
        grads.remove(l)
        grads.add(l - 1)
        del acts[l]
        if acts[l - 1] == "a":
            live -= chain.a_bytes(l - 1)
            del acts[l - 1]
        total += bwd_us
    if grads != {0} or acts:
        left = sorted(f"a^{l}" if k == "a" else f"abar^{l}" for l, k in acts.items())
        left += sorted(f"delta^{l}" for l in grads if l != 0)
        raise InvalidChainSequence(
            f"sequence ends with {', '.join(left) or 'no delta^0'} live; only delta^0 may remain"
        )
    return peak, total


def store_all_ops(chain: Chain) -> tuple[ChainOp, ...]:
    """The sequence without rematerialization: F_all 1..L, then B L..1."""
    L = chain.length
    return tuple(("F_all", l) for l in range(1, L + 1)) + tuple(("B", l) for l in range(L, 0, -1))


def store_all_schedule(chain: Chain) -> ChainSchedule:
    """What plain autograd does, as a ChainSchedule (time = sum u_f + sum u_b)."""
    ops = store_all_ops(chain)
    peak, total = simulate_chain(chain, ops)
    return ChainSchedule(ops, total, peak)
