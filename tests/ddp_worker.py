"""One rank of tests/test_ddp.py: `torchrun --nproc-per-node 2 tests/ddp_worker.py MODEL.py FAST.py OUT.json`.

Trains DDP over the eager model and DDP over the generated module's FastModel (same initial
state, same batches, small buckets so that a small model has several), over gloo, and
records in OUT.json (rank 0) or OUT.rank1.json:
  equal: every parameter gradient equal (torch.equal) between the two, at every iteration;
  events: per iteration, the order of `release` and `released` (the generated module runs its
      backward in segments, each handing finished parameter gradients to autograd: the start
      and end of `_advance`, which runs one),
      `allreduce` (DDP's comm hook: a bucket is launched) and `backward end`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    model_path, fast_path, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    model_file = load(model_path, "model_file")
    generated = load(fast_path, "fast_module")
    events: list[str] = []
    advance = generated._advance

    def logged_advance(*args):
        events.append("release")
        result = advance(*args)
        events.append("released")
        return result

    generated._advance = logged_advance
    eager = DDP(model_file.build_model(), bucket_cap_mb=0.25)
    fast = DDP(generated.FastModel(model_file.build_model()), bucket_cap_mb=0.25)

    def hook(state, bucket):
        events.append("allreduce")
        return default_hooks.allreduce_hook(None, bucket)

    fast.register_comm_hook(None, hook)
    inputs = model_file.sample_inputs()
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    equal, orders = True, []
    for iteration in range(3):
        grads = []
        for module in (eager, fast):
            module.zero_grad(set_to_none=True)
            torch.manual_seed(100 * iteration + rank)
            shifted = tuple(a.roll(rank + iteration, 0) if isinstance(a, torch.Tensor) else a for a in args)
            events.clear()
            model_file.loss_fn(module(*shifted)).backward()
            events.append("backward end")
            grads.append([p.grad.clone() for p in module.module.parameters()])
        orders.append(list(events))
        equal &= all(torch.equal(a, b) for a, b in zip(*grads))
    with open(out if rank == 0 else out + f".rank{rank}", "w") as handle:
        json.dump({"equal": equal, "events": orders}, handle)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # The outcome is written and the process group destroyed: leave without the interpreter's
    # teardown, as tests/fsdp_worker.py does, where torch 2.13 sometimes aborts a rank there
    # (SIGABRT after every result was written; see that file). Not seen here in 20 runs under
    # load, but it is the same exit.
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
