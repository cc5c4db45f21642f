"""Train a stock Hugging Face GPT-2 with a plan's generated module, beside eager PyTorch.

    python examples/train.py --steps 300 --budget 50%            # one process
    torchrun --nproc-per-node 2 examples/train.py --steps 300    # DDP, 2 gloo processes
    python examples/train.py --autocast bf16                     # mixed precision

This file is also the model file the plan is made for (`build_model`, `sample_inputs`):
rank 0 runs, as a user would, `remat plan examples/train.py --budget B > train.plan` and
`remat codegen train.plan -o train_fast.py` (in --workdir), the other ranks wait for it,
then every rank trains two copies of the same initial model on the same batches: the
eager model and `FastModel(model)` from the generated module, each wrapped in DDP when
launched by torchrun, both with AdamW.  The data is generated here: token sequences of a
fixed random Markov chain (each token draws the next from 4 likely successors), so the
loss falls from log(VOCAB) towards the chain's entropy.  At the end it writes the two
loss curves (matplotlib, --png), says whether they are identical at every step
(torch.equal on each step's loss: the generated module gives the same loss and
gradients bit for bit), and prints the measured peak memory of one training step of
each next to the plan's predicted peak.

Exit status 1 when a step's losses differ.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, SEQ, BATCH, LAYERS = 512, 64, 8, 4
ROOT = Path(__file__).resolve().parent.parent


def build_model() -> torch.nn.Module:
    """A stock GPT2LMHeadModel from a config (no download), dropout on, its own loss."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=LAYERS, n_embd=128, n_head=4, n_positions=SEQ, vocab_size=VOCAB, use_cache=False,
        attn_implementation="eager", bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model.train()


def sample_inputs() -> dict:
    """One batch of the training data: what the plan is made for."""
    return batch(0, rank=0)


def batch(step: int, rank: int) -> dict:
    """Batch `step` of rank `rank`: BATCH sequences of SEQ tokens of the Markov chain."""
    chain = torch.Generator().manual_seed(7)
    successors = torch.randint(0, VOCAB, (VOCAB, 4), generator=chain)
    weights = torch.tensor([0.55, 0.25, 0.15, 0.05])
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    tokens = torch.empty(BATCH, SEQ, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
    for i in range(1, SEQ):
        pick = torch.multinomial(weights, BATCH, replacement=True, generator=g)
        tokens[:, i] = successors[tokens[:, i - 1], pick]
    return {"input_ids": tokens, "labels": tokens}


def remat(*args: str, output: Path | None = None, quiet: bool = False) -> None:
    """`remat ARGS [> output]` as a user types it, its progress on stderr (none when
    `quiet`); exits on failure, after remat's own message."""
    command = [str(Path(sys.executable).parent / "remat"), *args]
    if not quiet:
        print(f"$ remat {' '.join(args)}" + (f" > {output}" if output else ""), file=sys.stderr, flush=True)
    with open(output, "w") if output else nullcontext() as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.PIPE if quiet else None, text=True)
    if result.returncode:
        sys.exit(f"remat {' '.join(args)} failed" + (f":\n{result.stderr}" if quiet else " (its message is above)"))


def load_module(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--budget", default="50%", help="the plan's budget (default 50%% of the autograd peak)")
    parser.add_argument("--autocast", choices=["bf16", "fp16", "none"], default="none")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--workdir", default="train-out", help="where the plan, the module and the PNG go")
    parser.add_argument("--png", default="loss.png")
    parser.add_argument("--quiet", action="store_true", help="no progress of the planning on stderr")
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    torch.set_num_threads(1 if distributed else torch.get_num_threads())
    work = Path(args.workdir)
    plan_path, module_path = work / "train.plan", work / "train_fast.py"
    if rank == 0:
        work.mkdir(parents=True, exist_ok=True)
        extra = ["--autocast", args.autocast] if args.autocast != "none" else []
        extra += ["--quiet"] if args.quiet else []
        if not args.quiet:
            print(f"planning {Path(__file__).name} for a budget of {args.budget} (a few minutes the first time; the"
                  " cache makes later runs quick)", file=sys.stderr, flush=True)  # fmt: skip
        remat("plan", f"{Path(__file__).resolve()}", "--budget", args.budget, *extra, output=plan_path,
              quiet=args.quiet)  # fmt: skip
        remat("codegen", str(plan_path), "-o", str(module_path), quiet=args.quiet)
    if distributed:
        dist.barrier()
    generated = load_module(module_path)

    eager, twin = build_model(), build_model()
    fast = generated.FastModel(twin)
    if distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        eager, fast = DDP(eager), DDP(fast)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=args.lr) for m in (eager, fast)]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.autocast)
    losses: tuple[list[float], list[float]] = ([], [])
    identical = True
    for step in range(args.steps):
        data = batch(step, rank)
        results = []
        for module, optimizer, curve in zip((eager, fast), optimizers, losses):
            optimizer.zero_grad(set_to_none=True)
            torch.manual_seed(step)  # dropout draws the same masks in both
            with torch.autocast("cpu", dtype=dtype) if dtype else nullcontext():
                loss = module(**data).loss
            loss.backward()
            optimizer.step()
            results.append(loss.detach())
            curve.append(float(results[-1]))
        identical &= torch.equal(results[0], results[1])
        if rank == 0 and (step % 50 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  eager {losses[0][-1]:.4f}  plan {losses[1][-1]:.4f}", flush=True)

    if rank == 0:
        from remat_dsl.capture.measure import step_peak
        from remat_dsl.capture.model_file import Inputs
        from remat_dsl.plan.parser import parse

        predicted = parse(plan_path.read_text(), str(plan_path)).header.peak_bytes
        inputs = Inputs(kwargs=sample_inputs())
        peaks = [step_peak(m.module if distributed else m, inputs) for m in (eager, fast)]
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(7, 4))
        axis.plot(losses[0], label=f"eager PyTorch (peak {peaks[0] / 2**20:.2f} MiB)", linewidth=3, alpha=0.5)
        axis.plot(losses[1], label=f"remat plan {args.budget} (peak {peaks[1] / 2**20:.2f} MiB)", linestyle="--")
        axis.set_xlabel("step")
        axis.set_ylabel("loss")
        axis.set_title(f"GPT-2 {LAYERS} layers, {world} process(es), autocast {args.autocast}")
        axis.legend()
        figure.tight_layout()
        figure.savefig(work / args.png, dpi=100)
        print(f"losses identical at every step: {'yes' if identical else 'NO'}")
        print(f"measured peak of one step: eager {peaks[0]:,} B, plan {peaks[1]:,} B (predicted {predicted:,} B)")
        print(f"wrote {work / args.png}")
    if distributed:
        flags = torch.tensor([int(identical)])
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        identical = bool(flags.item())
        dist.destroy_process_group()
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
