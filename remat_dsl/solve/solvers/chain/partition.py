"""Cut the FB-graph into a chain of blocks at its 1-separators (Rockmate, appendix A.4).

A forward op is a 1-separator when no tensor made before it is read by a forward op after
it: cutting right after it splits the forward graph in two that only its outputs connect.
Ops that depend on no parameter (position ids, attention masks) form a prelude that is
computed once, first, and kept while used, so they do not hide the chain structure.

Separators are many (nearly every op of an MLP is one); we keep those where the module
path changes at the deepest depth that yields at most `max_blocks` blocks, so blocks are
modules (`transformer.h.3.attn`, `transformer.h.3.mlp`), then merge the cheapest
neighbours if still too many.  Each backward op goes to the block of the forward module it
differentiates (of that module's run, for a module run several times: NOTE: [Modules run
several times]), lowered where needed so that B_L, ..., B_1 runs it after its producers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from remat_dsl.plan import ir
from remat_dsl.plan.ir import op_uses
from remat_dsl.plan.liveness import estimated_peak, live_intervals
from remat_dsl.plan.units import format_duration, human_bytes
from remat_dsl.solve.api import Decision
from remat_dsl.solve.solvers.chain.model import Block, Chain


@dataclass(frozen=True)
class BlockOps:
    """The ops of one chain block: forward ops in graph order, backward ops in graph order."""

    forward: tuple[str, ...]
    backward: tuple[str, ...]


@dataclass(frozen=True)
class ChainPartition:
    """prelude: parameter-free forward ops run first; blocks: the chain, in forward order."""

    prelude: tuple[str, ...]
    blocks: tuple[BlockOps, ...]
    chain: Chain


def partition(graph: ir.Graph, max_blocks: int = 40, refine: int = 0, strict: bool = True,
              min_block_ops: int = 6) -> ChainPartition:  # fmt: skip
    """Split `graph` into a prelude and a chain of blocks with rotor's costs (bytes, us).

    max_blocks: blocks at the chosen module depth, before refining (80 split a 32-layer
    decoder into attention and MLP blocks, but raised the Transformer example's smallest
    rockmate budget above rotor's).  refine > 0 cuts `refine` module levels deeper than
    the depth chosen for `max_blocks` and then merges small blocks into the next ones
    until each has `min_block_ops` forward ops (Rockmate's blocks: a GPT-2 layer becomes
    its attention and its MLP block, thesis section 2.3).  strict: refine only at
    separators no skip tensor crosses (for chain solvers, whose model does not see skip
    tensors); HiRemate's H-ILP sees them and refines at every separator, and bisects
    large blocks into halves of `min_block_ops` or more (NOTE: [Large blocks]).  The
    chain solvers' Configs hold max_blocks and min_block_ops (ChainConfig in
    remat_dsl.solve.solvers.chain.rotor, RockmateConfig, ...); the defaults are theirs.
    """
    tensors = graph.tensor_by_name
    forward = [op for op in graph.ops if op.phase == ir.FORWARD]
    backward = [op for op in graph.ops if op.phase == ir.BACKWARD]
    prelude = _prelude(graph, forward)
    chain_ops = [op for op in forward if op.name not in prelude]
    skips = _skip_tensors(chain_ops, _separators(chain_ops, set()))
    separators = _separators(chain_ops, skips)
    cuts = _choose_cuts(
        chain_ops, separators, max_blocks, refine, _separators(chain_ops, set()) if strict else separators,
        min_block_ops,
    )  # fmt: skip
    if not strict:
        cuts = _split_large_blocks(chain_ops, cuts, tensors, min_block_ops)
    fw_blocks = _split(chain_ops, cuts)
    bw_blocks = _assign_backward(backward, fw_blocks)
    blocks = tuple(BlockOps(tuple(o.name for o in f), tuple(o.name for o in b)) for f, b in zip(fw_blocks, bw_blocks))
    chain = _chain_costs(graph, blocks, tensors)
    return ChainPartition(tuple(op.name for op in forward if op.name in prelude), blocks, chain)


LARGE_BLOCK_FORWARD_OPS = 48  # a fallback's blocks may hold this many forward ops (NOTE: [Two partitions], rockmate.py)


def affordable(part: ChainPartition, than: ChainPartition) -> bool:
    """Whether RK-Checkmate's ILPs on `part`'s blocks cost about what they cost on
    `than`'s: no block of `part` has more forward ops than both `than`'s largest and
    LARGE_BLOCK_FORWARD_OPS (NOTE: [Two partitions] in remat_dsl.solve.solvers.ilp.rockmate)."""
    largest = lambda p: max((len(b.forward) for b in p.blocks), default=0)  # noqa: E731
    return largest(part) <= max(largest(than), LARGE_BLOCK_FORWARD_OPS)


def _prelude(graph: ir.Graph, forward: list[ir.Op]) -> set[str]:
    """The forward ops that depend on no parameter, run before the chain; a random op
    after a random op of the chain stays in the chain (NOTE: [Random ops in the prelude])."""
    params = {p.name for p in graph.parameters}
    depends: set[str] = set()  # tensors that depend on a parameter
    prelude: set[str] = set()
    random_in_chain = False
    for op in forward:
        if any(ref.name in params or ref.name in depends for ref in ir.op_refs(op)) or (op.random and random_in_chain):
            depends.update(op.outputs)
            random_in_chain = random_in_chain or op.random
        else:
            prelude.add(op.name)
    return prelude


# NOTE: [Random ops in the prelude]
# The prelude runs before the chain, so an op moved there runs before every op of the
# chain.  Random ops draw from one RNG stream in graph order (the verifier refuses any
# other order: check/replay.py).  SegFormer's drop path draws `rand(shape)`, which reads
# no parameter, after the first attention's dropout, which does: moved to the prelude it
# would draw first, and every chain solver's plan at a low budget would be refused.  So a
# random op after a random op of the chain stays in the chain, at its place in graph order.


def _separators(ops: list[ir.Op], skips: set[str]) -> list[int]:
    """Positions i such that no tensor made before op i, other than a skip tensor, is read
    after op i."""
    produced_at = {t: i for i, op in enumerate(ops) for t in op.outputs}
    reach = list(range(len(ops)))  # the furthest forward position reading a tensor made at i
    for j, op in enumerate(ops):
        for t in op_uses(op, set(produced_at) - skips):
            reach[produced_at[t]] = max(reach[produced_at[t]], j)
    result, furthest = [], -1
    for i in range(len(ops) - 1):
        if furthest <= i:
            result.append(i)
        furthest = max(furthest, reach[i])
    return result


def _skip_tensors(ops: list[ir.Op], separators: list[int]) -> set[str]:
    """Outputs of separator ops read again further on (residual and encoder-memory links).

    NOTE: [Skip tensors]
    Rotor's chain has one link between blocks.  A tensor made at a separator and read
    again several ops later (the input of a residual block, the encoder output every
    decoder layer attends to) would otherwise forbid every cut in between and leave one
    huge block.  We let such tensors cross cuts: the lowering keeps them alive while read,
    the exact simulation counts them, and the budget correction absorbs what rotor's
    model does not see (remat_dsl.solve.driver, NOTE: [Budget correction]).
    """
    return {t for i in separators for t in ops[i].outputs}


def _choose_cuts(ops, separators: list[int], max_blocks: int, refine: int = 0, strict: Sequence[int] = (),
                 min_block_ops: int = 6) -> list[int]:  # fmt: skip
    """Cuts at the deepest module depth giving at most `max_blocks` blocks.  With refine,
    `refine` levels deeper, among the `strict` separators only (no skip tensor crosses
    them, so the chain model sees every tensor alive between blocks), blocks merged until
    they hold `min_block_ops` forward ops."""
    for depth in range(8, 0, -1):
        cuts = _cuts_at(ops, separators, depth)
        if len(cuts) + 1 <= max_blocks:
            if refine:
                finer = sorted(
                    set(_cuts_at(ops, list(strict), depth + refine)) | set(_cuts_at(ops, list(strict), depth))
                )
                return _merge_small_blocks(finer, min_block_ops)
            return _merge_small(ops, cuts, max_blocks)
    return _merge_small(ops, separators, max_blocks)


def _cuts_at(ops: list[ir.Op], separators: list[int], depth: int) -> list[int]:
    return [i for i in separators if _prefix(ops[i].name, depth) != _prefix(ops[i + 1].name, depth)]


def _merge_small_blocks(cuts: list[int], min_ops: int) -> list[int]:
    """Keep a cut only once the block it closes has `min_ops` ops or more, so small
    modules (a layer norm, an add, a conv-BN-ReLU's pieces) join the ops that follow.
    The first block is kept whatever its size: it is the embedding of a transformer,
    which joined to the first layer made that layer unlike the others (Llama-2-7B: a
    130-op block class of its own, 30 s of ILPs, where the 31 others are solved once)."""
    kept: list[int] = []
    start = 0
    for cut in cuts:
        if cut - start + 1 >= min_ops or not kept:
            kept.append(cut)
            start = cut + 1
    return kept


MAX_CLUSTER_FORWARD_OPS = 32  # HiRemate's level-1 blocks hold at most this many forward ops


def _split_large_blocks(ops: list[ir.Op], cuts: list[int], tensors, min_block_ops: int = 6) -> list[int]:
    """`cuts` plus cuts inside every block of more than MAX_CLUSTER_FORWARD_OPS forward ops.

    NOTE: [Large blocks] Separators are rare where a tensor made inside one layer is read
    by later layers (T5's relative position bias, made in its first attention and added
    in every later one): no separator lies between the bias and its last reader, and one
    block spans several layers (160 ops for a 2-layer T5 encoder), whose RK-Checkmate
    ILP does not close its gap in minutes.  HiRemate's H-ILP sees every tensor that
    crosses its children (thesis section 3.3: H-Partition cuts any DAG, not only at
    separators), so such a block is bisected recursively at a module boundary: the
    outermost module change (a layer before a sub-layer before an op), then the fewest
    bytes crossing, then the middle; both halves keep `min_block_ops` ops or more."""
    crossing = [0] * (len(ops) + 1)  # bytes alive across the cut after position i (difference array)
    made = {t for op in ops for t in op.outputs}
    for iv in live_intervals([(op_uses(op, made), op.outputs) for op in ops]):  # NOTE: [Liveness]
        if iv.last_read is not None:
            crossing[iv.made] += tensors[iv.tensor].nbytes
            crossing[iv.last_read] -= tensors[iv.tensor].nbytes
    for i in range(1, len(ops)):
        crossing[i] += crossing[i - 1]

    def depth_of_change(i: int) -> int:
        a, b = ops[i].name.split("."), ops[i + 1].name.split(".")
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        return common

    def bisect(first: int, last: int) -> list[int]:
        if last - first + 1 <= MAX_CLUSTER_FORWARD_OPS:
            return []
        middle = (first + last) / 2
        candidates = range(first + min_block_ops - 1, last - min_block_ops + 1)
        cut = min(candidates, key=lambda i: (depth_of_change(i), crossing[i], abs(i - middle), i))
        return bisect(first, cut) + [cut] + bisect(cut + 1, last)

    result, bounds = [], [-1, *cuts, len(ops) - 1]
    for k in range(len(bounds) - 1):
        result += bisect(bounds[k] + 1, bounds[k + 1])
        if k < len(cuts):
            result.append(cuts[k])
    return result


def _prefix(name: str, depth: int) -> tuple[str, ...]:
    return tuple(name.split(".")[:depth])


def _merge_small(ops: list[ir.Op], cuts: list[int], max_blocks: int) -> list[int]:
    cuts = list(cuts)
    while len(cuts) + 1 > max_blocks:
        bounds = [-1, *cuts, len(ops) - 1]
        cost = [sum(o.time_us for o in ops[bounds[k] + 1 : bounds[k + 1] + 1]) for k in range(len(bounds) - 1)]
        k = min(range(len(cuts)), key=lambda c: (cost[c] + cost[c + 1], c))
        del cuts[k]
    return cuts


def _split(ops: list[ir.Op], cuts: list[int]) -> list[list[ir.Op]]:
    bounds = [-1, *cuts, len(ops) - 1]
    return [ops[bounds[k] + 1 : bounds[k + 1] + 1] for k in range(len(bounds) - 1)]


def _assign_backward(backward: list[ir.Op], fw_blocks: list[list[ir.Op]]) -> list[list[ir.Op]]:
    """Each backward op goes to a block of the forward module it differentiates (its name's
    part before `.bwd.`), never after the earliest block whose backward makes one of its
    inputs (B_L, ..., B_1 runs it after them): the module's last block.

    NOTE: [Modules run several times] A module called more than once (ALBERT's one layer
    run for every layer, an activation module shared by two branches) has its forward ops
    in blocks that are not contiguous, and its name says nothing of which run a backward op
    belongs to: were it given the last block, every run's backward would go to the last
    run, and ALBERT's smallest budget would be far higher (docs/measured-notes.md).  There an
    op that reads forward tensors goes to the module's first block at or after the last
    block that made them, and one that reads only gradients to the module's last block at
    or before the block that made them."""
    last = len(fw_blocks) - 1
    blocks_of: dict[tuple[str, ...], set[int]] = {}  # module path (every prefix of an op's name) -> its blocks
    made_in: dict[str, int] = {}
    for index, block in enumerate(fw_blocks):
        for op in block:
            parts = tuple(op.name.split("."))
            for length in range(1, len(parts) + 1):
                blocks_of.setdefault(parts[:length], set()).add(index)
            made_in.update((t, index) for t in op.outputs)
    made_by: dict[str, int] = {}
    result: list[list[ir.Op]] = [[] for _ in fw_blocks]
    for op in backward:
        module = tuple(op.name.split(".bwd.")[0].split(".")) if ".bwd." in op.name else ()
        held = sorted(blocks_of.get(module, ())) if module else []
        made = min((made_by[t] for t in op_uses(op, made_by.keys())), default=last)
        reads = [made_in[t] for t in op_uses(op, made_in.keys())]
        if not held:
            chosen = min(last, made)
        elif held[-1] - held[0] + 1 == len(held):  # one run (or runs side by side): its last block
            chosen = min(held[-1], made)
        elif reads:
            chosen = min(made, next((i for i in held if i >= max(reads)), held[-1]))
        else:
            chosen = next((i for i in reversed(held) if i <= made), made)
        for t in op.outputs:
            made_by[t] = chosen
        result[chosen].append(op)
    return result


def _chain_costs(graph: ir.Graph, blocks: tuple[BlockOps, ...], tensors) -> Chain:
    ops = graph.op_by_name
    block_of_tensor = {t: k for k, b in enumerate(blocks) for name in b.forward for t in ops[name].outputs}
    used_later, used_backward = _uses(graph, blocks, block_of_tensor)
    kept = _kept(blocks, ops, ir.pinned_tensors(graph))
    chain_blocks = []
    for k, block in enumerate(blocks):
        made = [t for name in block.forward for t in ops[name].outputs]
        out = sum(tensors[t].nbytes for t in made if used_later.get(t, -1) > k)
        saved = sum(tensors[t].nbytes for t in made if t in used_backward and used_later.get(t, -1) <= k)
        chain_blocks.append(
            Block(
                fwd_us=sum(ops[n].time_us for n in block.forward),
                bwd_us=sum(ops[n].time_us for n in block.backward),
                x_bytes=out,
                xbar_bytes=out + saved,
                grad_bytes=out,
                fwd_overhead=max(0, _transient(block.forward, ops, tensors) - out),
                bwd_overhead=_transient(block.backward, ops, tensors),
                kept_bytes=sum(tensors[t].nbytes for t in kept[k]),
            )
        )
    return Chain(tuple(chain_blocks), input_bytes=0, input_grad_bytes=0)


def _uses(graph, blocks, block_of_tensor):
    ops = graph.op_by_name
    used_later: dict[str, int] = {}
    used_backward: set[str] = set()
    for k, block in enumerate(blocks):
        for name in block.forward:
            for t in op_uses(ops[name], set(block_of_tensor)):
                used_later[t] = max(used_later.get(t, -1), k)
    for op in graph.ops:
        if op.phase == ir.BACKWARD:
            used_backward.update(op_uses(op, set(block_of_tensor)))
    return used_later, used_backward


def _kept(blocks: tuple[BlockOps, ...], ops: dict[str, ir.Op], pinned: set[str]) -> list[set[str]]:
    """Per block k: the step's outputs its backward makes (parameter gradients), which stay
    to the end of the step (NOTE: [Kept gradients] in remat_dsl.solve.solvers.chain.model).  A
    gradient that a block before k-1 reads (a skip connection's, a tied parameter's partial
    one) is live only until that block's backward; the chain cannot say so, and counting it
    to the end raised examples/resnet.py's smallest rotor budget from 48% to 69%, so it is
    left to the driver's budget correction."""
    return [{t for name in block.backward for t in ops[name].outputs if t in pinned} for block in blocks]


def _transient(names: tuple[str, ...], ops, tensors) -> int:
    """Peak bytes while running `names` in order with liveness (NOTE: [Liveness] in
    remat_dsl.plan.liveness), above nothing."""
    made = {t for n in names for t in ops[n].outputs}
    steps = [(op_uses(ops[n], made), ops[n].outputs) for n in names]
    return estimated_peak(steps, {t: tensors[t].nbytes for t in made}, [ops[n].temp_bytes for n in names])


def chain_steps(part: ChainPartition, ops, options=None, chain=None) -> tuple[tuple[str, ...], tuple[Decision, ...]]:
    """The op order of a chain sequence `ops` ((kind, l) or (kind, l, o) steps, rotor's
    vocabulary): the prelude, then each forward step's block ops and each backward step's
    backward ops (`options[l-1][o]`, option o's op sequence, when RK-Rotor chose one);
    and the decision of each step in words, at the position in the order where the step
    starts (remat_dsl.solve.api.Decision), for the plan's readers.  chain: the chain whose
    costs the words quote (`part.chain`, or RK-Rotor's with options)."""
    order, decisions = list(part.prelude), []
    for kind, l, *rest in ops:
        block, o = part.blocks[l - 1], rest[0] if rest else 0
        if kind != "B":
            step = block.forward
        else:
            step = options[l - 1][o] if options is not None else block.backward
        if step:  # a block with no backward op (its ops need no gradient) has an empty B step: no words
            decisions.append(Decision(len(order), _step_text(part, chain or part.chain, kind, l, o, options)))
        order += step
    return tuple(order), tuple(decisions)


TEXT_WIDTH = 116  # characters of a decision: its comment line (`  # ` + text) stays within 120


def _step_text(part: ChainPartition, chain: Chain, kind: str, l: int, o: int, options) -> str:
    """The decision for step (kind, l, o) in words, within TEXT_WIDTH: the block named by
    its module path, with fewer of its children listed, or `block l`, when it is too long."""
    for children in (3, 2, 1):
        text = _words(part, chain, kind, l, o, options, block_name(part, l, children))
        if len(text) <= TEXT_WIDTH:
            return text
    return _words(part, chain, kind, l, o, options, f"block {l}")


def _words(part: ChainPartition, chain: Chain, kind: str, l: int, o: int, options, name: str) -> str:
    block = chain.blocks[l - 1]
    if kind == "B":
        return f"{name}: backward"
    if kind == "F_n":
        return f"{name}: forward, keeps nothing (recomputed later)"
    if kind == "F_ck":
        saves = block.xbar_bytes - block.x_bytes
        return (
            f"{name}: checkpoint, recomputed in the backward: saves {human_bytes(saves)} for"
            f" {format_duration(block.fwd_us)}"
        )
    if options is None or len(options[l - 1]) == 1:
        return f"{name}: forward, keeps its activations ({human_bytes(block.xbar_bytes)})"
    n = len(options[l - 1]) - 1
    if o == 0:
        return f"{name}: option 0 of {n}, keeps its activations ({human_bytes(block.xbar_bytes)})"
    option = block.options[o - 1]
    forward = set(part.blocks[l - 1].forward)
    prefix = name.split("{")[0] if "{" in name else name + "."  # the module path they share
    recomputed = [op.removeprefix(prefix) for op in dict.fromkeys(options[l - 1][o]) if op in forward]
    tail = (
        f": saves {human_bytes(block.xbar_bytes - option.xbar_bytes)} for"
        f" {format_duration(option.bwd_us - block.bwd_us)}"
    )
    head = f"{name}: option {o} of {n}, recompute "
    listed = recomputed[:1]
    while (
        len(listed) < len(recomputed)
        and len(head + ", ".join(recomputed[: len(listed) + 1]) + " and 99 more" + tail) <= TEXT_WIDTH
    ):
        listed = recomputed[: len(listed) + 1]
    more = f" and {len(recomputed) - len(listed)} more" if len(listed) < len(recomputed) else ""
    text = head + ", ".join(listed) + more + tail
    return text if len(text) <= TEXT_WIDTH else f"{head}{len(recomputed)} ops{tail}"


def block_name(part: ChainPartition, l: int, children: int = 3) -> str:
    """What block l holds, for people: its one op's name; the module path its forward ops
    share when they are all of that module's (`transformer.h.3.mlp`); else that path and at
    most `children` of the modules under it (`transformer.h.3.{ln_2, mlp, add_1}`)."""
    forward = part.blocks[l - 1].forward
    if len(forward) == 1:
        return forward[0]
    paths = [op.split(".") for op in forward]
    common: list[str] = []
    for at_depth in zip(*paths):
        if len(set(at_depth)) != 1:
            break
        common.append(at_depth[0])
    if common:
        prefix = ".".join(common) + "."
        elsewhere = [op for k, b in enumerate(part.blocks) if k != l - 1 for op in b.forward] + list(part.prelude)
        if not any(op.startswith(prefix) for op in elsewhere):
            return ".".join(common)
    names: dict[str, None] = {}
    for parts in paths:
        rest = parts[len(common) :]
        if rest:
            child = [rest[0]] + [p for p in rest[1:-1] if p.isdigit()][:1]  # `h.0`, not `h`
            names[".".join(child)] = None
    inner = ", ".join(list(names)[:children]) + (", ..." if len(names) > children else "")
    return f"{'.'.join(common)}.{{{inner}}}" if common else f"{{{inner}}}"


AUTO_CHAIN_SHARE = (
    0.4  # the largest block holds at most this share of the forward ops (NOTE: [Chains of two layers]) ...
)
AUTO_BLOCK_OPS = 64  # ... and at most this many (a Llama decoder layer, attention and gated MLP, is 48)


# NOTE: [Chains of two layers]
# A stock decoder built from a small config has two layers, so its attention block holds
# about a third of the forward ops: OLMo's 17 of 53, Qwen3's 34 of 102 (its q/k norms),
# Gemma-2's 43 of 139.  Such chains plan better with Rockmate over their strict blocks
# (smaller feasible budgets, faster plans at most budgets) than at a share of 0.3, which
# sends them to HiRemate's H-ILP root over its non-strict blocks.  Above 0.4 are graphs
# that are no chain of layers: the strict cuts of BART (0.49), CLIP (0.52), T5 (0.52),
# the U-Net (0.86) leave one block spanning what skip tensors cross (the encoder output
# every decoder layer reads), where HiRemate's H-ILP sees every tensor; GPT-J's parallel
# attention and MLP is one block of 42 of 88 ops, about as well planned by either.  The
# price is Gemma-2's: its eager attention with soft-capping is a block of 42 forward ops,
# whose RK-Checkmate ILPs take over a minute per block class.  The comparison of both
# paths per model is in docs/measured-notes.md.


def is_small_chain(graph: ir.Graph) -> bool:
    """Cut at the separators no skip tensor crosses (Rockmate's blocks), no block holds
    more than AUTO_CHAIN_SHARE of the forward ops nor more than AUTO_BLOCK_OPS of them:
    a chain of small blocks (GPT-2, the ResNet, a stock decoder of two layers), which
    chain solvers plan well."""
    sizes = [len(b.forward) for b in partition(graph, refine=1).blocks]
    largest = max(sizes)
    return largest <= AUTO_CHAIN_SHARE * sum(sizes) and largest <= AUTO_BLOCK_OPS
