"""Seeded random mutations of real plans never crash the tool and never train wrong.

The plans in tests/plans were written by `remat plan` (the tiny MLP with autograd,
checkmate and forced recomputation of its dropout, a hand-made offload, a tiny conv net
with BatchNorm planned by checkmate).  Each mutant is one of: a line deleted, duplicated
or swapped with another, a token replaced by another token of the file or by junk,
random bytes inserted, the file truncated.  Each goes through what `remat check` and
`remat codegen` do:

* parse and verify (remat_dsl.check.verify.verify) may only raise the tool's own RematError;
* an accepted plan is generated (remat_dsl.codegen.generate), its module is imported, and one
  training step of FastModel is compared with eager PyTorch from the same seed: the loss,
  every parameter gradient and every buffer must be torch.equal.

`make test` runs MUTANTS per plan; `pytest -m slow tests/test_fuzz_plans.py` runs
SLOW_MUTANTS in all (the issue's 3000) with other seeds.
"""

from __future__ import annotations

import random
import re
import types
from collections import Counter
from pathlib import Path

import pytest
import torch

from remat_dsl.check.verify import verify
from remat_dsl.codegen.generate import generate
from remat_dsl.plan.errors import RematError
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.plan.parser import parse

ROOT = Path(__file__).resolve().parent.parent
PLANS = {
    "tiny_mlp_autograd.plan": "tests/models/tiny_mlp.py",
    "tiny_mlp_checkmate.plan": "tests/models/tiny_mlp.py",
    "tiny_mlp_recompute.plan": "tests/models/tiny_mlp.py",
    "tiny_mlp_offload.plan": "tests/models/tiny_mlp.py",
    "tiny_cnn_checkmate.plan": "tests/models/tiny_cnn.py",
}
MUTANTS = 70  # per plan in `make test`: 350 in all
SLOW_MUTANTS = 3000  # in all, behind `-m slow`
JUNK = [
    "",
    "x",
    "-1",
    "0",
    "%",
    "[",
    "(",
    "#",
    "on",
    "delete",
    "compute",
    "1e400",
    "nan",
    "é",
    "\t",
    "99999999999999999999",
    "%fc1",
    "float33",
]


# ---------------------------------------------------------------------------
# Mutations
# ---------------------------------------------------------------------------


def mutate(text: str, rng: random.Random) -> tuple[str, str]:
    """(kind, mutant) for one random mutation of `text`."""
    lines = text.split("\n")
    kind = rng.choice(["delete", "duplicate", "swap", "swap-near", "token", "junk-token", "bytes", "truncate"])
    i = rng.randrange(len(lines))
    if kind == "delete":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(i, lines[i])
    elif kind in ("swap", "swap-near"):
        j = min(len(lines) - 1, i + rng.randint(1, 3)) if kind == "swap-near" else rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind in ("token", "junk-token"):
        tokens = list(re.finditer(r"\S+", lines[i]))
        if tokens:
            token = rng.choice(tokens)
            pool = re.findall(r"\S+", text) if kind == "token" else JUNK
            lines[i] = lines[i][: token.start()] + rng.choice(pool) + lines[i][token.end() :]
    elif kind == "bytes":
        at = rng.randrange(len(text) + 1)
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))).decode("utf-8", errors="replace")
        return kind, text[:at] + junk + text[at:]
    else:
        return kind, text[: rng.randrange(len(text))]
    return kind, "\n".join(lines)


# ---------------------------------------------------------------------------
# One training step, eager and generated
# ---------------------------------------------------------------------------


class Reference:
    """One SGD-free training step of the eager model: loss, gradients and buffers after it."""

    def __init__(self, model_path: str):
        self.model_file = load_model_file(str(ROOT / model_path))
        self.inputs = self.model_file.sample_inputs()
        self.loss, self.grads, self.buffers = self.step(self.model_file.build_model())

    def step(self, module: torch.nn.Module, model: torch.nn.Module | None = None):
        model = model or module
        torch.manual_seed(1000)
        loss = self.model_file.loss_fn(self.inputs.call(module))
        loss.backward()
        grads = {name: p.grad for name, p in model.named_parameters()}
        buffers = {name: b.clone() for name, b in model.named_buffers()}
        return loss.detach(), grads, buffers

    def same_as_eager(self, source: str) -> list[str]:
        """What differs between one step of the generated module and eager (empty: nothing)."""
        module = types.ModuleType("fuzzed_plan")
        exec(compile(source, "<generated>", "exec"), module.__dict__)
        model = self.model_file.build_model()
        loss, grads, buffers = self.step(module.FastModel(model), model)
        wrong = [] if torch.equal(loss, self.loss) else ["loss"]
        wrong += [f"grad {n}" for n, g in grads.items() if not _same(g, self.grads[n])]
        wrong += [f"buffer {n}" for n, b in buffers.items() if not torch.equal(b, self.buffers[n])]
        return wrong


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


@pytest.fixture(scope="module")
def references() -> dict[str, Reference]:
    return {path: Reference(path) for path in sorted(set(PLANS.values()))}


def run_mutants(plan_name: str, reference: Reference, count: int, seed: int) -> Counter:
    """Mutate `plan_name` `count` times; assert the two properties; count the outcomes."""
    text = (ROOT / "tests" / "plans" / plan_name).read_text()
    rng = random.Random(seed)
    outcomes: Counter = Counter()
    for index in range(count):
        kind, mutant = mutate(text, rng)
        where = f"{plan_name} mutant {index} (seed {seed}, {kind})"
        try:
            verified = verify(parse(mutant, "mutant.plan"))
        except RematError:
            outcomes["rejected"] += 1
            continue
        except Exception as error:  # noqa: BLE001 - the property under test
            pytest.fail(f"{where}: {type(error).__name__} escaped the tool: {error}\n{_diff(text, mutant)}")
        try:
            source = generate(verified, source="mutant.plan")
            wrong = reference.same_as_eager(source)
        except Exception as error:  # noqa: BLE001
            pytest.fail(
                f"{where}: an accepted plan failed in codegen or training: {type(error).__name__}:"
                f" {error}\n{_diff(text, mutant)}"
            )
        assert (
            not wrong
        ), f"{where}: an accepted plan trains differently from eager ({', '.join(wrong)})\n{_diff(text, mutant)}"
        outcomes["accepted, trains like eager"] += 1
    return outcomes


def _diff(old: str, new: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "plan", "mutant", n=1))[:3000]


@pytest.mark.parametrize("plan_name", sorted(PLANS))
def test_mutants_are_refused_or_train_like_eager(plan_name, references):
    outcomes = run_mutants(plan_name, references[PLANS[plan_name]], MUTANTS, seed=sorted(PLANS).index(plan_name))
    assert sum(outcomes.values()) == MUTANTS
    assert outcomes["rejected"] > 0 and outcomes["accepted, trains like eager"] > 0, outcomes  # both paths run


@pytest.mark.slow
def test_three_thousand_mutants(references):
    outcomes: Counter = Counter()
    per_plan = SLOW_MUTANTS // len(PLANS)
    for index, plan_name in enumerate(sorted(PLANS)):
        outcomes += run_mutants(plan_name, references[PLANS[plan_name]], per_plan, seed=1000 + index)
    assert sum(outcomes.values()) == SLOW_MUTANTS
    print(f"\n{SLOW_MUTANTS} mutants: {dict(outcomes)}")
