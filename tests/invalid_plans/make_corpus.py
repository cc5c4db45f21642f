"""Regenerate the corpus of invalid plans from the two valid tiny-MLP plans.

Every case is a base plan (tests/invalid_plans/bases/tiny_mlp_autograd_v1.plan or tiny_mlp_offload_v1.plan,
in format version 1, which the tools still read)
with a few named text edits; each edit must apply exactly once.  Running this script
rewrites tests/invalid_plans/NAME.plan for every case (and removes plans of cases that
no longer exist).  With `--update` it also rewrites the golden diagnostics NAME.diag:
the exact stderr of `remat check tests/invalid_plans/NAME.plan` run from the repository
root.  The goldens are part of the interface: read every changed one before committing.

    .venv/bin/python tests/invalid_plans/make_corpus.py            # plans only
    .venv/bin/python tests/invalid_plans/make_corpus.py --update   # plans and goldens
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PLANS = HERE / "bases"  # the two valid tiny-MLP plans in format version 1, which the edits anchor on
AUTOGRAD = "tiny_mlp_autograd_v1.plan"
OFFLOAD = "tiny_mlp_offload_v1.plan"


@dataclass(frozen=True)
class Case:
    name: str
    base: str  # a file name in tests/plans
    what: str  # the mistake, in words
    edits: tuple[tuple[str, str], ...]  # (old, new) text replacements, each applied once


def _case(name: str, base: str, what: str, *edits: tuple[str, str]) -> Case:
    return Case(name, base, what, tuple(edits))


CUT = "<cut>"  # an edit's new text ending in CUT drops the rest of the file

# Lines of the base plans that the edits anchor on (the base plans are canonical, so the
# column alignment below is exact).
A_FWD_RELU = "  compute  relu    on compute\n"
A_FWD_DELETE_FC1 = "  delete   fc1     on compute\n"
A_FWD_DROP = "  compute  drop    on compute\n"
A_FWD_FC2 = "  compute  fc2     on compute\n"
A_FWD_HEAD = "  compute  head    on compute\n"
A_INPUT_X = "  x  float32[16, 32]\n"
A_INPUT_X_B = "  x  float32[B <= 16, 32]\n"
A_HEAD_SUM = "  head.bwd.sum = aten.sum.dim_IntList(%grad_output.0, [0], True)"
A_BWD_FC1_SUM = "  compute  fc1.bwd.sum                       on compute\n"
A_BWD_LAST = "  delete   drop.bwd.threshold_backward       on compute\n"
O_FWD_OFFLOAD = (
    "  # relu is saved for the backward of the first ReLU: keep it on the host meanwhile\n"
    "  offload  relu    on d2h\n"
)
O_FWD_WAIT = "  wait     relu    on compute\n"
O_FWD_DELETE = "  delete   relu    on compute\n"
O_BWD_PREFETCH = "  prefetch  relu                              on h2d\n"
O_BWD_WAIT = "  wait      relu                              on compute\n"

CASES: tuple[Case, ...] = (
    # --- syntax errors (the parser) ------------------------------------------------
    _case("syntax_missing_on", AUTOGRAD, "the `on` before the stream is left out",
          (A_FWD_FC2, "  compute  fc2     compute\n")),
    _case("syntax_unknown_verb", AUTOGRAD, "`free` instead of `delete`",
          (A_FWD_DELETE_FC1, "  free     fc1     on compute\n")),
    _case("syntax_misspelled_verb", AUTOGRAD, "a typo in a verb",
          (A_FWD_DROP, "  comptue  drop    on compute\n")),
    _case("syntax_unknown_stream", OFFLOAD, "a stream that does not exist",
          ("  offload  relu    on d2h\n", "  offload  relu    on d2d\n")),
    _case("syntax_stream_named_cuda", AUTOGRAD, "a device name where a stream belongs",
          (A_FWD_FC2, "  compute  fc2     on cuda\n")),
    _case("syntax_wrong_stream", OFFLOAD, "an offload on the host-to-device stream",
          ("  offload  relu    on d2h\n", "  offload  relu    on h2d\n")),
    _case("syntax_delete_on_transfer_stream", AUTOGRAD, "a delete on a copy stream",
          (A_FWD_DELETE_FC1, "  delete   fc1     on d2h\n")),
    _case("syntax_percent_on_target", AUTOGRAD, "a `%` reference as an instruction target",
          (A_FWD_RELU, "  compute  %relu   on compute\n")),
    _case("syntax_unindented_instruction", AUTOGRAD, "an instruction at column 1",
          (A_FWD_FC2, "compute  fc2     on compute\n")),
    _case("syntax_misspelled_section", AUTOGRAD, "`backwards` instead of `backward`",
          ("\nbackward\n", "\nbackwards\n")),
    _case("syntax_sections_out_of_order", AUTOGRAD, "the tangents after the tensors",
          ("tangents\n  grad_output.0  float32[16, 8]\n\n", ""),
          ("\nops\n", "\ntangents\n  grad_output.0  float32[16, 8]\n\nops\n")),
    _case("syntax_truncated_file", AUTOGRAD, "the file ends before the backward section",
          ("\nbackward\n", "\n" + CUT)),
    _case("syntax_misplaced_comment", AUTOGRAD, "a column-1 comment between sections",
          ("\nbackward\n", "\n# the backward pass\nbackward\n")),
    _case("syntax_budget_without_unit", AUTOGRAD, "a size without its unit",
          ("  budget      37164 B\n", "  budget      37164\n")),
    _case("syntax_unknown_size_unit", AUTOGRAD, "`KB` instead of `KiB`",
          ("  fc2.bwd.mm_1                      [64, 64]  float32    16 KiB",
           "  fc2.bwd.mm_1                      [64, 64]  float32    16 KB ")),
    _case("syntax_time_without_unit", AUTOGRAD, "a duration without its unit",
          ("  time        0.139 ms\n", "  time        0.139\n")),
    _case("syntax_unknown_status", AUTOGRAD, "a status that does not exist",
          ("  status      baseline\n", "  status      handwritten\n")),
    _case("syntax_gap_not_a_number", AUTOGRAD, "a gap that is not a percentage",
          ("  status      baseline\n", "  status      feasible\n  gap         abc\n")),
    _case("syntax_gap_without_percent", AUTOGRAD, "a gap without its `%`",
          ("  status      baseline\n", "  status      feasible\n  gap         1.23\n")),
    _case("syntax_solve_time_without_unit", AUTOGRAD, "a solve time without its unit",
          ("  status      baseline\n", "  status      feasible\n  gap         1.23%\n  solve-time  2.4\n")),
    _case("syntax_solve_time_before_gap", AUTOGRAD, "the header's solve-time above its gap",
          ("  status      baseline\n", "  status      feasible\n  solve-time  2.4 s\n  gap         1.23%\n")),
    _case("syntax_unknown_phase", AUTOGRAD, "`fwd` instead of `forward`",
          ("0.004 ms     0 B    forward\n", "0.004 ms     0 B    fwd\n")),
    _case("syntax_bare_name_argument", AUTOGRAD, "an argument without its `%`",
          ("aten.relu.default(%fc1)", "aten.relu.default(fc1) ")),
    _case("syntax_trailing_comment_in_table", AUTOGRAD, "a comment after a tensor row",
          ("  relu                              [16, 64]  float32     4 KiB  relu\n",
           "  relu                              [16, 64]  float32     4 KiB  relu  # saved\n")),
    _case("syntax_unsupported_version", AUTOGRAD, "a format version this tool does not read",
          ("remat-plan 1\n", "remat-plan 3\n")),
    # --- size expressions (NOTE: [Size expressions] in remat_dsl/plan/ir.py) ---------------
    _case("size_symbol_undeclared", AUTOGRAD, "a size expression naming S where the inputs declare B",
          (A_INPUT_X, A_INPUT_X_B), (A_HEAD_SUM, A_HEAD_SUM.replace("[0]", "[S - 1]"))),
    _case("size_symbol_without_inputs", AUTOGRAD, "a size expression where the inputs declare no symbol",
          (A_HEAD_SUM, A_HEAD_SUM.replace("[0]", "[2*B]"))),
    _case("size_division", AUTOGRAD, "a size expression dividing",
          (A_INPUT_X, A_INPUT_X_B), (A_HEAD_SUM, A_HEAD_SUM.replace("[0]", "[B / 2]"))),
    _case("size_power", AUTOGRAD, "a size expression with a power",
          (A_INPUT_X, A_INPUT_X_B), (A_HEAD_SUM, A_HEAD_SUM.replace("[0]", "[B ** 2]"))),
    _case("size_float", AUTOGRAD, "a size expression with a float",
          (A_INPUT_X, A_INPUT_X_B), (A_HEAD_SUM, A_HEAD_SUM.replace("[0]", "[B*1.5]"))),
    _case("size_call", AUTOGRAD, "a size expression calling a function",
          (A_INPUT_X, A_INPUT_X_B), (A_HEAD_SUM, A_HEAD_SUM.replace("[0]", "[B + len(%x)]"))),
    _case("size_reference", AUTOGRAD, "a size expression adding a tensor",
          (A_INPUT_X, A_INPUT_X_B), (A_HEAD_SUM, A_HEAD_SUM.replace("[0]", "[B + %x]"))),
    _case("size_out_of_range", AUTOGRAD, "a size expression with a coefficient of 2**70",
          (A_INPUT_X, A_INPUT_X_B), (A_HEAD_SUM, A_HEAD_SUM.replace("[0]", "[1180591620717411303424*B]"))),
    # --- scalar reads (NOTE: [Scalar reads] in remat_dsl/plan/operators.py) ---------------
    _case("scalar_read_of_many_elements", AUTOGRAD, "dropout's p read from a tensor of 1024 elements",
          ("aten.native_dropout.default(%relu, 0.1, True)",
           "aten.native_dropout.default(%relu, aten._local_scalar_dense.default(%fc1), True)")),
    _case("scalar_read_inside_a_view", AUTOGRAD, "a number read from a tensor where a view's tensor goes",
          ("aten.t.default(%fc1.weight)", "aten.t.default(aten._local_scalar_dense.default(%fc1.weight))")),
    # --- names -------------------------------------------------------------------------
    _case("unknown_op", AUTOGRAD, "compute of an op that is not in the graph",
          (A_FWD_FC2, "  compute  fc3     on compute\n")),
    _case("unknown_tensor", AUTOGRAD, "delete of a tensor that is not in the graph",
          ("  delete   relu_1                            on compute\n",
           "  delete   relu1                             on compute\n")),
    _case("unknown_ref_in_op", AUTOGRAD, "an op argument that names no value",
          ("aten.relu.default(%fc1)", "aten.relu.default(%fc_1)")),
    _case("unknown_gradient_parameter", AUTOGRAD, "a gradient for a parameter that does not exist",
          ("  head.bias   = aten.view.default", "  head.bais   = aten.view.default")),
    _case("compute_of_a_tensor", AUTOGRAD, "compute of an op's second output",
          (A_FWD_DROP, "  compute  drop:1  on compute\n")),
    _case("delete_of_a_tangent", AUTOGRAD, "delete of a tangent",
          (A_BWD_LAST, A_BWD_LAST + "  delete   grad_output.0                     on compute\n")),
    # --- order of computation ------------------------------------------------------------
    _case("use_before_compute", AUTOGRAD, "relu computed before its input fc1",
          ("  compute  fc1     on compute\n" + A_FWD_RELU, A_FWD_RELU + "  compute  fc1     on compute\n")),
    _case("use_after_delete", AUTOGRAD, "drop deleted before fc2 uses it",
          (A_FWD_DROP, A_FWD_DROP + "  delete   drop    on compute\n")),
    _case("saved_tensor_deleted_in_forward", AUTOGRAD, "the saved relu deleted in the forward section",
          (A_FWD_DROP, A_FWD_DROP + "  delete   relu    on compute\n")),
    _case("saved_tensor_deleted_early_in_backward", AUTOGRAD, "the saved drop:1 deleted before its use",
          ("  delete   drop:1                            on compute\n", ""),
          ("  delete   drop                              on compute\n",
           "  delete   drop                              on compute\n"
           "  delete   drop:1                            on compute\n")),
    _case("forward_op_never_computed", AUTOGRAD, "the forward section leaves out fc2",
          (A_FWD_FC2, "")),
    _case("forward_op_never_computed_at_end", AUTOGRAD, "the forward section leaves out head",
          (A_FWD_HEAD, "")),
    _case("forward_op_computed_twice", AUTOGRAD, "compute where recompute is meant",
          (A_FWD_HEAD, A_FWD_HEAD + "  compute  relu_1  on compute\n")),
    _case("forward_op_computed_in_backward", AUTOGRAD, "compute of a forward op in backward",
          (A_BWD_FC1_SUM, A_BWD_FC1_SUM + "  compute  fc1                               on compute\n")),
    _case("recompute_before_compute", AUTOGRAD, "recompute of an op that has not run yet",
          (A_FWD_FC2, "  recompute  fc2   on compute\n")),
    _case("backward_op_never_computed", AUTOGRAD, "the backward section leaves out fc1.bwd.sum",
          (A_BWD_FC1_SUM, "")),
    _case("backward_op_computed_twice", AUTOGRAD, "fc1.bwd.sum computed twice",
          (A_BWD_FC1_SUM, A_BWD_FC1_SUM + A_BWD_FC1_SUM)),
    _case("backward_op_recomputed", AUTOGRAD, "recompute of a backward op",
          (A_BWD_FC1_SUM, A_BWD_FC1_SUM + "  recompute  fc1.bwd.sum                     on compute\n")),
    _case("backward_op_in_forward", AUTOGRAD, "a backward op in the forward section",
          (A_FWD_HEAD, A_FWD_HEAD + "  compute  head.bwd.mm  on compute\n")),
    # --- delete --------------------------------------------------------------------------
    _case("delete_twice", AUTOGRAD, "fc1 deleted twice",
          (A_FWD_DELETE_FC1, A_FWD_DELETE_FC1 + A_FWD_DELETE_FC1)),
    _case("delete_before_compute", AUTOGRAD, "relu_1 deleted before it is computed",
          (A_FWD_FC2, "  delete   relu_1  on compute\n" + A_FWD_FC2)),
    _case("delete_model_output", AUTOGRAD, "delete of the model output",
          (A_FWD_HEAD, A_FWD_HEAD + "  delete   head    on compute\n")),
    _case("delete_parameter_gradient", AUTOGRAD, "delete of a parameter gradient",
          (A_BWD_LAST, A_BWD_LAST + "  delete   fc1.bwd.mm                        on compute\n")),
    _case("delete_during_offload", OFFLOAD, "delete of relu before its offload is waited for",
          (O_FWD_WAIT, "")),
    # --- offload, prefetch, wait -------------------------------------------------------
    _case("offload_before_compute", OFFLOAD, "offload of relu before relu exists",
          (O_FWD_OFFLOAD, ""),
          ("  compute  fc1     on compute\n", "  offload  relu    on d2h\n  compute  fc1     on compute\n")),
    _case("offload_after_delete", OFFLOAD, "offload of relu after it was deleted",
          (O_FWD_OFFLOAD, ""), (O_FWD_WAIT, ""),
          (O_FWD_DELETE, O_FWD_DELETE + "  offload  relu    on d2h\n")),
    _case("offload_twice", OFFLOAD, "relu offloaded twice",
          (O_FWD_WAIT, O_FWD_WAIT + "  offload  relu    on d2h\n")),
    _case("prefetch_not_offloaded", OFFLOAD, "prefetch of relu without an offload",
          (O_FWD_OFFLOAD, ""), (O_FWD_WAIT, "")),
    _case("prefetch_while_resident", OFFLOAD, "prefetch of relu while it is still on the device",
          (O_FWD_DELETE, "")),
    _case("use_before_wait", OFFLOAD, "relu used while its prefetch is in flight",
          (O_BWD_WAIT, "")),
    _case("use_after_offload_without_prefetch", OFFLOAD, "relu used in backward with only a host copy",
          (O_BWD_PREFETCH, ""), (O_BWD_WAIT, "")),
    _case("wait_without_transfer", AUTOGRAD, "wait for a tensor with nothing in flight",
          (A_FWD_DELETE_FC1, "  wait     fc1     on compute\n" + A_FWD_DELETE_FC1)),
    _case("offload_never_waited", AUTOGRAD, "an offload still in flight when the step ends",
          (A_BWD_LAST, A_BWD_LAST + "  offload  fc1.bwd.mm                        on d2h\n")),
    _case("transfer_without_bandwidth", OFFLOAD, "an offload with a zero bandwidth",
          ("  bandwidth   12 GB/s\n", "  bandwidth   0 GB/s\n")),
    # --- memory --------------------------------------------------------------------------
    _case("peak_above_budget", AUTOGRAD, "the autograd plan under a 32 KiB budget",
          ("  budget      37164 B\n", "  budget      32 KiB\n")),
    _case("peak_above_budget_offload", OFFLOAD, "the offload plan under a 30000 B budget",
          ("  budget      37164 B\n", "  budget      30000 B\n")),
)


def plan_text(case: Case) -> str:
    text = (PLANS / case.base).read_text(encoding="utf-8")
    for old, new in case.edits:
        count = text.count(old)
        if count != 1:
            raise SystemExit(f"{case.name}: edit anchor found {count} times in {case.base}: {old!r}")
        text = text.replace(old, new)
    return text.split(CUT)[0]


def canonical(text: str) -> str:
    """The text in the canonical layout when it parses (so `remat fmt --check` passes on
    the corpus wherever it can), else as edited (the syntax-error cases)."""
    from remat_dsl.plan.errors import PlanError
    from remat_dsl.plan.parser import parse
    from remat_dsl.plan.printer import print_plan

    try:
        return print_plan(parse(text))
    except PlanError:
        return text


def relative_path(name: str) -> str:
    """How the corpus names a plan on the command line: relative to the repository root."""
    return f"tests/invalid_plans/{name}.plan"


def check_in_process(rel_path: str) -> tuple[int, str, str]:
    """`remat check REL_PATH` run inside this process from the repository root: (status, stdout, stderr)."""
    import os

    from remat_dsl.cli import main

    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["check", rel_path])
    finally:
        os.chdir(cwd)
    return status, out.getvalue(), err.getvalue()


def write_corpus(update: bool) -> list[str]:
    names = {case.name for case in CASES}
    if len(names) != len(CASES):
        raise SystemExit("duplicate case names")
    for stale in HERE.glob("*.plan"):
        if stale.stem not in names:
            stale.unlink()
            (HERE / f"{stale.stem}.diag").unlink(missing_ok=True)
    changed = []
    for case in CASES:
        (HERE / f"{case.name}.plan").write_text(canonical(plan_text(case)), encoding="utf-8")
        if update:
            status, _, stderr = check_in_process(relative_path(case.name))
            if status != 2:
                raise SystemExit(f"{case.name}: `remat check` exited {status}, expected 2:\n{stderr}")
            golden = HERE / f"{case.name}.diag"
            if not golden.exists() or golden.read_text(encoding="utf-8") != stderr:
                golden.write_text(stderr, encoding="utf-8")
                changed.append(case.name)
    return changed


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    update = "--update" in sys.argv[1:]
    changed = write_corpus(update)
    print(f"wrote {len(CASES)} plans" + (f"; goldens changed: {', '.join(changed) or 'none'}" if update else ""))
