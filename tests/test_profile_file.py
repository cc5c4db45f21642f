"""Profile files: `remat profile` writes measured costs, `remat plan --profile` reuses them."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from remat_dsl.plan import ir
from remat_dsl.plan.errors import PlanError
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.plan.parser import parse
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.plan.printer import print_plan
from remat_dsl.capture.profile_file import apply_profile, read_profile, write_profile
from remat_dsl.check.replay import simulate
from remat_dsl.solve.driver import autograd_peak, make_plan

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "tests" / "models" / "tiny_mlp.py")
RESNET = str(ROOT / "examples" / "resnet.py")


def remat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "remat_dsl", *args], capture_output=True, text=True, cwd=ROOT)


SOLVE_TIME_LINE = re.compile(r"^  solve-time  [0-9]+\.[0-9] s\n", re.M)


def without_solve_time(text: str) -> str:
    """The plan text less its header's `solve-time` line, if it has one (at most one)."""
    assert len(SOLVE_TIME_LINE.findall(text)) <= 1, text
    return SOLVE_TIME_LINE.sub("", text, count=1)


def assert_same_plan_text(a: str, b: str) -> None:
    """Byte-identical plans, but for the header's `solve-time` line: the solver's wall
    time is the one thing two runs on the same model, profile and budget may differ in."""
    has_time = [bool(SOLVE_TIME_LINE.search(text)) for text in (a, b)]
    assert has_time[0] == has_time[1], "one plan has a solve-time line, the other not"
    if has_time[0]:
        rest_a, rest_b = without_solve_time(a), without_solve_time(b)
        assert len(rest_a.splitlines()) == len(a.splitlines()) - 1
        assert rest_a == rest_b
    else:
        assert a == b


@pytest.fixture(scope="module")
def tiny():
    """The tiny MLP captured with timing (repeats 1) and without."""
    model_file = load_model_file(TINY)
    timed = capture_graph(model_file, repeats=1)
    untimed = capture_graph(model_file, measure_time=False)
    return model_file, timed, untimed


@pytest.fixture(scope="module")
def tiny_profile(tiny, tmp_path_factory):
    """A profile of the tiny MLP written by `remat profile`, and its text."""
    path = tmp_path_factory.mktemp("profiles") / "tiny.profile"
    result = remat("profile", TINY, "-o", str(path), "--repeats", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert f"wrote {path}" in result.stderr
    assert not list(path.parent.glob(".tiny.profile*"))  # no temporary file left behind
    return path, path.read_text()


# --- the format ----------------------------------------------------------------


def test_capture_without_timing_keeps_everything_but_times(tiny):
    _, timed, untimed = tiny
    assert all(op.time_us == 0 for op in untimed.graph.ops)
    assert any(op.time_us > 0 for op in timed.graph.ops)
    zero = replace(timed.graph, ops=tuple(replace(op, time_us=0) for op in timed.graph.ops))
    assert untimed.graph == zero
    assert untimed.device == timed.device


def test_round_trip_is_exact(tiny):
    model_file, timed, _ = tiny
    text = write_profile(timed.graph, model=model_file.spec, device=timed.device)
    profile = read_profile(text, "tiny.profile")
    assert profile.model == model_file.spec and profile.device == timed.device
    assert [(i.name, i.dtype, i.shape) for i in profile.inputs] == [
        (v.name, v.dtype, v.shape) for v in timed.graph.inputs
    ]
    assert [(o.name, o.time_us, o.temp_bytes) for o in profile.ops] == [
        (o.name, o.time_us, o.temp_bytes) for o in timed.graph.ops
    ]
    assert apply_profile(timed.graph, profile, model=model_file.spec) == timed.graph
    assert (
        write_profile(
            apply_profile(timed.graph, profile), model=profile.model, device=profile.device, torch_version=profile.torch
        )
        == text
    )


def test_a_profile_keeps_the_measured_temporaries_alone(tiny):
    """NOTE: [Gradient zeros] in fbgraph.py: with a second output to differentiate, the ops
    of the head's backward count the zeros of its gradient (16 x 8 float32) among their
    temporaries; the file keeps what was measured, and applying it puts the zeros back."""
    model_file, timed, untimed = tiny
    second = (ir.ValueDecl("tangent", "grad_output.1", (16, 8), "float32"),)
    assert ir.gradient_zeros(timed.graph) == {}  # one output: its gradient always comes
    graph = ir.with_gradient_zeros(replace(timed.graph, tangents=timed.graph.tangents + second))
    assert ir.gradient_zeros(graph) == {"head.bwd.mm": 512, "head.bwd.mm_1": 512, "head.bwd.sum": 512}
    assert [
        op.temp_bytes - old.temp_bytes for op, old in zip(graph.ops, timed.graph.ops) if op.temp_bytes != old.temp_bytes
    ] == [512] * 3
    text = write_profile(graph, model=model_file.spec, device=timed.device)
    assert text == write_profile(timed.graph, model=model_file.spec, device=timed.device)
    assert apply_profile(replace(untimed.graph, tangents=untimed.graph.tangents + second), read_profile(text)) == graph


@pytest.mark.parametrize(
    "time_us, temp_bytes",
    [(0, 0), (1, 1), (999, 1023), (1000, 1024), (123_456_789, 1_572_864), (7, 263_296), (1_000_001, 3 * 2**30 + 1)],
)
def test_every_time_and_temp_reads_back(tiny, time_us, temp_bytes):
    model_file, timed, _ = tiny
    ops = tuple(replace(op, time_us=time_us, temp_bytes=temp_bytes) for op in timed.graph.ops)
    graph = ir.with_gradient_zeros(replace(timed.graph, ops=ops))  # as capture makes it
    text = write_profile(graph, model="a model.py:build", device="cuda:0", torch_version="2.13.0+cpu")
    profile = read_profile(text, "p.profile")
    assert (profile.model, profile.device, profile.torch) == ("a model.py:build", "cuda:0", "2.13.0+cpu")
    assert apply_profile(timed.graph, profile) == graph


def test_a_profile_is_readable(tiny_profile):
    _, text = tiny_profile
    lines = text.split("\n")
    assert lines[0] == "remat-profile 1"
    assert lines[1] == f'model   "{TINY}"'
    assert "input   x  float32[16, 32]" in lines
    fc1 = next(line for line in lines if line.strip().startswith("fc1 "))
    assert fc1.split()[2:] == ["ms", "0", "B"]
    assert all(line == line.rstrip() for line in lines)
    # hand-written variations read the same: comments, other units, no alignment
    edited = text.replace("\nops\n", "\n# reviewed by hand\nops  # one line per op\n").replace(
        "input   x  float32[16, 32]", "input x float32[16,32]"
    )
    fc1_time = next(op.time_us for op in read_profile(text).ops if op.name == "fc1")
    edited = _edit_op(edited, "fc1", f"fc1 {fc1_time} us 0 KiB")
    assert read_profile(edited).ops == read_profile(text).ops


@pytest.mark.parametrize(
    "edit, message, hint",
    [
        (lambda t: t.replace("remat-profile 1", "remat-profile 2"), "expected `remat-profile 1`", "remat profile"),
        (lambda t: _edit_op(t, "fc1", "fc1  1.5 ms  0 lb"), "unknown size unit `lb`", "`KiB`"),
        (lambda t: _edit_op(t, "fc1", "fc1  0.0015 ms  0 B"), "`0.0015 ms` is not a whole number of us", "round it"),
        (lambda t: _edit_op(t, "fc1", "fc1  fast ms  0 B"), "cannot read the duration `fast ms`", "0.123 ms"),
        (lambda t: _edit_op(t, "fc1", "fc1  1 ms"), "an op line is `NAME  TIME  TEMP`", "fc1"),
        (lambda t: _edit_op(t, "relu", "fc1  1 ms  0 B"), "op `fc1` is listed twice", "the first is line"),
        (lambda t: t.replace("device  cpu", "colour  blue"), "unknown header key `colour`", "expected `model`"),
        (lambda t: t.replace("\nops\n", "\n"), "unknown header key `fc1`", "expected"),
    ],
)
def test_syntax_errors_have_a_location_and_a_fix(tiny_profile, edit, message, hint):
    _, text = tiny_profile
    bad = edit(text)
    with pytest.raises(PlanError) as caught:
        read_profile(bad, "bad.profile")
    shown = caught.value.format()
    first = shown.splitlines()[0]
    assert first.startswith("bad.profile:"), shown
    line, col = first.split(":")[1:3]
    assert line.isdigit() and col.isdigit(), shown
    assert message in shown and hint in shown and "^" in shown


def _edit_op(text: str, name: str, new_line: str) -> str:
    return "\n".join(f"  {new_line}" if line.split()[:1] == [name] else line for line in text.split("\n"))


# --- applying a profile to a graph ---------------------------------------------


def test_profile_of_other_inputs_is_refused(tiny, tiny_profile):
    _, _, untimed = tiny
    _, text = tiny_profile
    other = text.replace("float32[16, 32]", "float32[8, 32]")
    with pytest.raises(PlanError) as caught:
        apply_profile(untimed.graph, read_profile(other, "other.profile"))
    shown = caught.value.format()
    assert shown.startswith("other.profile:5:")
    assert "float32[8, 32]" in shown and "float32[16, 32]" in shown
    assert "run `remat profile` again" in shown


def test_op_missing_from_the_profile_is_refused(tiny, tiny_profile):
    _, _, untimed = tiny
    _, text = tiny_profile
    without = "\n".join(line for line in text.split("\n") if line.split()[:1] != ["fc2.bwd.mm"])
    with pytest.raises(PlanError) as caught:
        apply_profile(untimed.graph, read_profile(without, "t.profile"))
    shown = caught.value.format()
    assert "no costs for op `fc2.bwd.mm`" in shown
    assert "the profile was made for another model or other input shapes: run `remat profile` again" in shown
    line = int(shown.split(":")[1])
    assert without.split("\n")[line - 1] == "ops"


def test_op_the_graph_lacks_is_refused(tiny, tiny_profile):
    _, _, untimed = tiny
    _, text = tiny_profile
    extra = text.rstrip("\n") + "\n  fc3  0.001 ms  0 B\n"
    with pytest.raises(PlanError) as caught:
        apply_profile(untimed.graph, read_profile(extra, "t.profile"))
    shown = caught.value.format()
    assert "the graph has no op `fc3`" in shown
    assert shown.startswith(f"t.profile:{len(extra.split(chr(10))) - 1}:3:")


def test_other_model_spec_is_refused(tiny, tiny_profile):
    _, _, untimed = tiny
    _, text = tiny_profile
    with pytest.raises(PlanError) as caught:
        apply_profile(untimed.graph, read_profile(text, "t.profile"), model=TINY + ":build_other")
    assert caught.value.format().startswith("t.profile:2:9: error: the profile was made for model")
    # the same file seen from another directory is the same model
    assert apply_profile(untimed.graph, read_profile(text), model="tests/models/tiny_mlp.py")


# --- the command line ------------------------------------------------------------


def test_same_plan_text_ignores_only_the_solve_time():
    plan = parse((ROOT / "tests" / "plans" / "tiny_mlp_offload.plan").read_text())
    header = replace(plan.header, status="feasible", gap=0.0123)
    texts = [print_plan(replace(plan, header=replace(header, solve_seconds=t))) for t in (2.4, 61.0)]
    assert texts[0] != texts[1]
    assert_same_plan_text(texts[0], texts[1])
    assert_same_plan_text(print_plan(plan), print_plan(plan))
    with pytest.raises(AssertionError):
        assert_same_plan_text(texts[0], print_plan(replace(plan, header=replace(header, gap=0.02, solve_seconds=2.4))))
    with pytest.raises(AssertionError):
        assert_same_plan_text(texts[0], print_plan(replace(plan, header=header)))


def test_plan_from_a_profile_is_byte_identical(tiny, tiny_profile):
    path, text = tiny_profile
    runs = [remat("plan", TINY, "--budget", "100%", "--profile", str(path)) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert f"costs from {path}" in run.stderr
    assert runs[0].stdout == runs[1].stdout  # byte for byte: no solve-time line unless asked for
    assert not SOLVE_TIME_LINE.search(runs[0].stdout)
    # the same plan made in-process from the same profile (with the solve time, left out here)
    model_file, _, untimed = tiny
    graph = apply_profile(untimed.graph, read_profile(text, str(path)), model=model_file.spec)
    budget = autograd_peak(graph, untimed.device)  # 100%
    plan = make_plan(graph, model=model_file.spec, device=untimed.device, budget=budget, solver="auto")
    assert without_solve_time(print_plan(plan)) == runs[0].stdout
    # the plan carries the profile's costs, with the output gradient's zeros (NOTE: [Gradient zeros])
    parsed = parse(runs[0].stdout)
    profile, zeros = read_profile(text), ir.gradient_zeros(parsed.graph)
    assert [(o.name, o.time_us, o.temp_bytes) for o in parsed.graph.ops] == [
        (o.name, o.time_us, o.temp_bytes + zeros.get(o.name, 0)) for o in profile.ops
    ]


def test_profile_of_another_model_exits_2(tiny_profile):
    path, _ = tiny_profile
    result = remat("plan", RESNET, "--budget", "50%", "--profile", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert f"{path}:2:9: error: the profile was made for model" in result.stderr
    assert "hint:" in result.stderr and "remat profile" in result.stderr


def test_profile_file_missing_exits_2(tmp_path):
    result = remat("plan", TINY, "--budget", "50%", "--profile", str(tmp_path / "none.profile"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "cannot read the profile" in result.stderr


def test_editing_one_time_changes_only_that_op_and_the_predictions(tiny, tiny_profile):
    model_file, _, untimed = tiny
    _, text = tiny_profile
    profile = read_profile(text)
    fc2 = next(op for op in profile.ops if op.name == "fc2")
    edited = _edit_op(text, "fc2", f"fc2  {(fc2.time_us + 1234) / 1000:.3f} ms  0 B")

    def plan_text(profile_text: str) -> str:
        graph = apply_profile(untimed.graph, read_profile(profile_text), model=model_file.spec)
        budget = autograd_peak(graph, untimed.device)  # 100%: the schedule does not depend on times
        return print_plan(make_plan(graph, model=model_file.spec, device=untimed.device, budget=budget, solver="rotor"))

    before, after = without_solve_time(plan_text(text)).split("\n"), without_solve_time(plan_text(edited)).split("\n")
    assert len(before) == len(after)
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    keys = sorted(a.split()[0] for a, _ in changed)
    assert keys == ["compute", "fc2", "graph", "items", "time"], changed  # the digest seals the op's new time
    plan = parse("\n".join(after))
    assert next(op for op in plan.graph.ops if op.name == "fc2").time_us == fc2.time_us + 1234
    sim = simulate(plan)
    assert sim.peak_bytes <= plan.header.budget
    assert plan.header.time_us == parse("\n".join(before)).header.time_us + 1234


def test_plan_help_mentions_profile():
    result = remat("plan", "--help")
    assert "--profile" in result.stdout
    assert remat("profile", "--help").returncode == 0


def test_gpt2_plan_from_a_profile_is_byte_identical_and_valid(tmp_path):
    gpt2 = str(ROOT / "examples" / "gpt2.py")
    profile = tmp_path / "gpt2.profile"
    made = remat("profile", gpt2, "-o", str(profile), "--repeats", "1")
    assert made.returncode == 0, made.stderr
    runs = [remat("plan", gpt2, "--budget", "50%", "--profile", str(profile)) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr
    assert runs[0].stdout == runs[1].stdout  # byte for byte, with auto's MILP solver (rockmate)
    plan = parse(runs[0].stdout)
    assert any(ins.verb == "recompute" for ins in plan.forward + plan.backward)
    assert simulate(plan).peak_bytes <= plan.header.budget
    zeros = ir.gradient_zeros(
        plan.graph
    )  # NOTE: [Gradient zeros]: the logits' gradient, 2 MiB, for the LM head's backward
    costs = {
        op.name: (op.time_us, op.temp_bytes + zeros.get(op.name, 0)) for op in read_profile(profile.read_text()).ops
    }
    assert {op.name: (op.time_us, op.temp_bytes) for op in plan.graph.ops} == costs
