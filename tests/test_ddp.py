"""The generated module under DDP (issue 12 part 3), 2 gloo processes launched by torchrun as
a user would: gradients equal DDP over the eager model, and DDP's first all-reduce is
launched before the plan's backward ends, because finished parameter gradients are handed
to autograd mid-backward (NOTE: [Gradient release] in templates/module.py.jinja)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MODEL = ROOT / "examples" / "gpt2.py"


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, command + "\n" + result.stderr[:6000] + "\n...\n" + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def fast_gpt2(tmp_path_factory) -> Path:
    """The GPT-2 example's module generated from its plan at 60%, as a user makes it."""
    where = tmp_path_factory.mktemp("ddp")
    run(f"{BIN}/remat plan {MODEL} --budget 60% --no-cache > gpt2.plan", where)
    run(f"{BIN}/remat codegen gpt2.plan -o fast_gpt2.py", where)
    return where / "fast_gpt2.py"


def test_ddp_gradients_equal_and_all_reduce_overlaps_the_backward(fast_gpt2, tmp_path):
    run(
        f"{BIN}/torchrun --standalone --nproc-per-node 2 {ROOT}/tests/ddp_worker.py {MODEL} {fast_gpt2} result.json",
        tmp_path,
    )
    for name in ("result.json", "result.json.rank1"):
        outcome = json.loads((tmp_path / name).read_text())
        assert outcome["equal"], name
        for events in outcome["events"][1:]:  # from the second iteration on, DDP's buckets are rebuilt in ready order
            assert "released" in events and "allreduce" in events
            last_segment = (
                len(events) - 1 - events[::-1].index("released")
            )  # the plan's backward after its last release
            assert events.index("allreduce") < last_segment, events


@pytest.mark.parametrize(("model", "budget"), [("examples/gpt2.py", "60%"), ("tests/models/hf_llama.py", "70%")])
def test_fsdp2_gradients_and_steps_equal_fsdp2_over_the_eager_model(model, budget, tmp_path):
    """fully_shard on every block and on the model, then FastModel (or FastModel first):
    the gradients' shards and the parameters after SGD steps equal FSDP2 over the eager
    model on both ranks, the parameters stay sharded, and the plan gathers its blocks one
    by one, never all at once (NOTE: [FSDP2] in remat_dsl/codegen/runtime.py)."""
    run(f"{BIN}/remat plan {ROOT / model} --budget {budget} --no-cache > model.plan", tmp_path)
    run(f"{BIN}/remat codegen model.plan -o fast_model.py", tmp_path)
    run(
        f"{BIN}/torchrun --standalone --nproc-per-node 2 {ROOT}/tests/fsdp_worker.py {ROOT / model} fast_model.py"
        " result.json",
        tmp_path,
    )
    for name in ("result.json", "result.json.rank1"):
        outcome = json.loads((tmp_path / name).read_text())
        assert outcome["equal"] and outcome["sharded"] and outcome["built_before"], (name, outcome)
        assert 2 <= outcome["blocks"] and 1 <= outcome["most_gathered"] < outcome["blocks"], (name, outcome)


FSDP_PART_SCRIPT = """
import importlib.util, os, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[3])
dist.init_process_group("gloo", rank=0, world_size=1)
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
model_file, generated = load(sys.argv[1], "model_file"), load(sys.argv[2], "fast_module")
model = model_file.build_model()
for block in model.transformer.h:
    fully_shard(block)
try:
    generated.FastModel(model)(*model_file.sample_inputs())
    print("ran")
except NotImplementedError as error:
    print("refused:", error)
model = model_file.build_model()
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
for block in model.transformer.h:
    fully_shard(block, mp_policy=policy)
fully_shard(model, mp_policy=policy)
try:
    generated.FastModel(model)(*model_file.sample_inputs())
    print("ran")
except NotImplementedError as error:
    print("refused:", error)
dist.destroy_process_group()
"""


def test_fsdp2_it_cannot_run_is_refused(fast_gpt2, tmp_path):
    """fully_shard on the blocks only (FSDP2 has no root whose hooks can run the step), and
    a MixedPrecisionPolicy that gathers bf16 parameters for a plan made in float32."""
    (tmp_path / "fsdp.py").write_text(FSDP_PART_SCRIPT)
    lines = run(f"{sys.executable} fsdp.py {MODEL} {fast_gpt2} 29571", tmp_path).stdout.splitlines()
    assert lines[-2].startswith("refused: fully_shard was applied to some of the model's modules but not to"), lines
    assert lines[-1].startswith("refused: FSDP2 gathers parameter 'transformer.wte.weight' as torch.bfloat16"), lines
