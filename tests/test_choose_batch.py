"""`remat plan --optimizer ... --choose-batch` (NOTE: [Batch choice] in remat_dsl/workflow/__init__.py):
the whole step planned at the sample batch, its halves and its doubles, a line per batch on
stderr, the plan of the batch with the least predicted time per sample on stdout.  Through
the shell, as users type it."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from test_stock_models import MODELS, shell

MLP = MODELS / "tiny_mlp.py"  # sample batch 16
SAMPLE = 16
# The tiny MLP's step time is mostly per-op overhead and the update of its 7 KiB of
# parameters, nearly the same at every batch: the time per sample falls as the batch grows,
# so the largest batch that fits wins.  100 KiB holds its whole step up to batch 64, not 128.
BUDGET = "100KiB"
ROW = re.compile(
    r"^batch (\d+): (?:step (\d+)\.(\d{3}) ms, [\d.]+ us/sample, peak .*, host peak .*"
    r"|does not fit \(the smallest budget that fits is .*\))$",
    re.M,
)


def _copy(model: Path, directory: Path, batch: int | None = None) -> None:
    """`model` copied to `directory`/mlp.py; with `batch`, its sample_inputs() give that
    batch: the sample rows cut, or repeated along dim 0, as --choose-batch makes them."""
    directory.mkdir()
    text = model.read_text()
    if batch is not None:
        text += (
            "\n\n_sample_inputs = sample_inputs\n\n\ndef sample_inputs() -> tuple:\n    (x,) = _sample_inputs()\n"
            f"    return (torch.cat([x] * max(1, {batch} // x.shape[0]))[:{batch}].clone(),)\n"
        )
    (directory / "mlp.py").write_text(text)


def test_the_batch_with_the_least_time_per_sample_is_planned(tmp_path):
    _copy(MLP, tmp_path / "chosen")
    result = shell(
        f"remat plan mlp.py --optimizer 'sgd lr=0.05 momentum=0.9' --budget {BUDGET} --repeats 1 --choose-batch"
        " > m.plan",
        tmp_path / "chosen",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {int(m[1]): m for m in ROW.finditer(result.stderr)}
    batches = sorted(rows)
    assert batches[0] == 1 and batches == [2**k for k in range(len(batches))], result.stderr[-3000:]
    assert SAMPLE in batches and batches[-1] <= 8 * SAMPLE
    fitting = {b: Fraction(int(m[2]) * 1000 + int(m[3]), b) for b, m in rows.items() if m[2] is not None}
    # upward from the sample, every batch fits until the first that does not, the last tried
    assert all(b in fitting for b in batches[:-1]), result.stderr[-3000:]
    assert batches[-1] not in fitting or batches[-1] == 8 * SAMPLE
    chosen = int(re.search(r"^chose batch (\d+): the least predicted time per sample", result.stderr, re.M)[1])
    assert fitting[chosen] == min(fitting.values()) and chosen == max(fitting), result.stderr[-3000:]
    assert chosen > SAMPLE  # the reasoning above: a larger batch amortizes the update

    text = (tmp_path / "chosen" / "m.plan").read_text()
    top, rest = text.split("\n", 1)
    assert top.startswith(f"# remat plan --choose-batch: batch {chosen}, the least predicted us per sample of 1: ")
    assert all(f"{b}: " in top for b in batches)
    assert re.search(rf"^inputs\n  x  float32\[{chosen}, 32\]\n", rest, re.M), rest[:2000]

    _copy(MLP, tmp_path / "at", chosen)
    alone = shell(
        f"remat plan mlp.py --optimizer 'sgd lr=0.05 momentum=0.9' --budget {BUDGET} --repeats 1 > m.plan",
        tmp_path / "at",
    )
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert (tmp_path / "at" / "m.plan").read_text() == rest


@pytest.mark.parametrize(
    "options, message",
    [
        ("--budget 100KiB", "error: --choose-batch plans the whole step: it needs --optimizer"),
        (
            "--budget 100KiB --optimizer sgd --dynamic batch",
            "error: --choose-batch and --dynamic both set the batch the plan is for",
        ),
        (
            "--budget 100KiB --optimizer sgd --profile m.profile",
            "error: --choose-batch captures the model at other batches, where --profile's op costs do not hold",
        ),
    ],
)
def test_choose_batch_is_refused_where_it_has_no_meaning(options, message, tmp_path):
    result = shell(f"remat plan {MLP} {options} --choose-batch > m.plan", tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr and "hint: " in result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "m.plan").read_text() == ""


def test_a_percentage_is_of_the_sample_batch_and_growth_stops_at_8_times_it(tmp_path):
    result = shell(f"remat plan {MLP} --optimizer sgd --budget 500% --repeats 1 --choose-batch > m.plan", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    budgets = set(re.findall(r"^solving with \w+ for a budget of (.*)$", result.stderr, re.M))
    assert len(budgets) == 1, budgets  # 500% of batch 16's autograd peak, at every batch
    rows = {int(m[1]): m for m in ROW.finditer(result.stderr)}
    assert sorted(rows) == [1, 2, 4, 8, 16, 32, 64, 128] and all(m[2] is not None for m in rows.values())
    assert re.search(r"^chose batch 128:", result.stderr, re.M), result.stderr[-3000:]
    budget = budgets.pop()
    assert f"\n  budget      {budget}\n" in (tmp_path / "m.plan").read_text()
