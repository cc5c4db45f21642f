"""Plans written to make the tools or the generated module run code (issue 45, part 8).

Each case is the tiny MLP's recompute plan (tests/plans/tiny_mlp_recompute.plan: dropout,
recomputed, gradients released mid-backward) with one hostile edit, sealed again as an
attacker can (`resealed`: the digest is a checksum, not a signature) or left as edited.
The payloads try to create the file `sentinel` in the working directory: from the header's
strings, the model's output classes, operator names, symbols, constants, keyword names,
comments holding `\"\"\"`, `{{` and `{%`, device kinds and dtypes.  `python
tests/adversarial/corpus.py` rewrites tests/adversarial/NAME.plan for every case;
tests/test_adversarial.py checks each file is what this module makes, runs `remat check`,
`codegen`, `textconv`, `diff`, `fmt --check` and `show` on it as a user would, imports every
module codegen accepted, trains it a step, and checks that `sentinel` never appears.

Each case says what the tools answer: `status` of `remat check` and `remat codegen` (0 or
2) with a `message` on stderr, and for an accepted plan what training through its module
gives (`runtime`: "trains" bit for bit like eager, or the message of the exception
`FastModel` raises).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BASE = ROOT / "tests" / "plans" / "tiny_mlp_recompute.plan"
MODEL = ROOT / "tests" / "models" / "tiny_mlp.py"
SENTINEL = "sentinel"
CODE = f'__import__("pathlib").Path("{SENTINEL}").touch()'
BREAKOUT = f'x.py"""\n{CODE}\n"""'  # closes a docstring, runs a statement, opens one again
BREAKOUT_QUOTE = f"x.py'''\n{CODE}\n'''\"\n{CODE}\n#"


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    make: Callable[[], str]  # the plan's text
    status: int = 0  # of `remat check` and `remat codegen`
    message: str = ""  # on stderr, when status is 2
    runtime: str = "trains"  # training through the generated module: "trains" or the error's message


def base():
    from remat_dsl.plan.parser import parse

    return parse(BASE.read_text(encoding="utf-8"), str(BASE))


def sealed(edit) -> Callable[[], str]:
    """The base plan edited in the IR and printed: sealed by the printer."""

    def make() -> str:
        from remat_dsl.plan.printer import print_plan

        return print_plan(edit(base()))

    return make


def edited(old: str, new: str, reseal: bool = False) -> Callable[[], str]:
    """The base plan's text with `old` (once) replaced by `new`; `reseal`: the digest section
    recomputed for the edited text, as `digest_of` computes it."""

    def make() -> str:
        text = BASE.read_text(encoding="utf-8")
        assert text.count(old) == 1, old
        text = text.replace(old, new)
        return resealed(text) if reseal else text

    return make


def resealed(text: str) -> str:
    from remat_dsl.plan import digest
    from remat_dsl.plan.parser import parse

    plan = parse(text)
    seal = digest.digest_of(plan.graph, plan.header)
    head = text[: text.index("\ndigest\n")]
    return (
        head
        + "\ndigest\n"
        + "".join(f"  {line}\n" for line in [f"graph  {seal.graph}", *(f"items  {c}" for c in seal.items)])
    )


def header(**changes):
    return sealed(lambda p: replace(p, header=replace(p.header, **changes)))


def outputs(target: str):
    from remat_dsl.plan import ir

    return sealed(
        lambda p: replace(p, graph=replace(p.graph, outputs=ir.Call(target, (), (("args", ir.Ref("head")),))))
    )


def first_op(**changes):
    return sealed(
        lambda p: replace(p, graph=replace(p.graph, ops=(replace(p.graph.ops[0], **changes), *p.graph.ops[1:])))
    )


def constant(value):
    from remat_dsl.plan import ir

    return sealed(lambda p: replace(p, graph=replace(p.graph, constants=(ir.ConstantInput("mode", value),))))


def _arg_call(target, *args):
    from remat_dsl.plan import ir

    return ir.Call(target, args)


FC1 = "  fc1 = aten.addmm.default(%fc1.bias, %x, aten.t.default(%fc1.weight))"
MODEL_LINE = '  model       "tests/models/tiny_mlp.py"'
NOT_A_CONTAINER = "which is not a data container"
RERUN = "re-run `remat plan`"

CASES: tuple[Case, ...] = (
    # --- the header's strings reach the module as literals only --------------------
    Case("header_model_breakout", "the model string closes the module's docstring", header(model=BREAKOUT)),
    Case("header_model_quotes", "the model string closes a ''' and a \" string", header(model=BREAKOUT_QUOTE)),
    Case(
        "header_model_unicode_escapes",
        "the payload written as \\u escapes, so a raw diff shows only hex",
        edited(
            MODEL_LINE,
            '  model       "x.py\\u0022\\u0022\\u0022\\u000a'
            + CODE.replace('"', "\\u0022")
            + '\\u000a\\u0022\\u0022\\u0022"',
            reseal=True,
        ),
    ),
    Case("header_solver_breakout", "the solver string closes the module's docstring", header(solver=BREAKOUT)),
    Case("header_costs_breakout", "the costs string closes the module's docstring", header(costs=BREAKOUT)),
    Case(
        "header_counts_jinja",
        "the counts string holds template syntax",
        header(counts='{{ "pwn" ~ "ed" }} {% raw %} {# x #}'),
    ),
    Case(
        "header_model_edited_unsealed",
        "the model string edited, the digest left as it was",
        edited(MODEL_LINE, '  model       "' + BREAKOUT.replace('"', '\\"').replace("\n", "\\n") + '"'),
        status=2,
        message="the header's `model` line was edited",
    ),
    Case(
        "header_device_breakout",
        "a device string that would close a string literal",
        header(device="cuda'); " + CODE + "; ('"),
        status=2,
        message="unknown device",
    ),
    # --- the output's classes: data containers among the imported modules only --------
    Case("outputs_popen", "the output built by subprocess.Popen", outputs("subprocess.Popen"), runtime=NOT_A_CONTAINER),
    Case("outputs_os_system", "the output built by os.system", outputs("os.system"), runtime=NOT_A_CONTAINER),
    Case(
        "outputs_builtins_exec", "the output built by builtins.exec", outputs("builtins.exec"), runtime=NOT_A_CONTAINER
    ),
    Case(
        "outputs_unimported_module",
        "a class of a module no one imported (importing it runs its code)",
        outputs("antigravity.Fly"),
        runtime="which no module imported so far defines",
    ),
    Case(
        "outputs_other_class", "a class that is not a data container", outputs("pathlib.Path"), runtime=NOT_A_CONTAINER
    ),
    Case(
        "outputs_bare_name",
        "a class without its module",
        outputs("Popen"),
        status=2,
        message="is not a dotted path",
    ),
    # --- operators, symbols, constants, keywords -----------------------------------------
    Case("op_target_os_system", "an op whose target is os.system", first_op(target="os.system"), 2, "unknown operator"),
    Case(
        "op_target_dunder",
        "an op whose target walks to a dunder attribute",
        first_op(target="aten.__class__.default"),
        2,
        "unknown operator",
    ),
    Case(
        "inline_call_system",
        "a call of os.system inside an op's arguments",
        edited(FC1, FC1.replace("aten.t.default(", "os.system("), True),
        2,
        "unknown operator `os.system`",
    ),
    Case(
        "symbol_torch_os_system",
        "a symbol that names a function reachable from torch",
        edited(FC1, FC1.replace("%fc1.bias, %x", "%fc1.bias, torch.os.system"), True),
        2,
        "is not a torch dtype, layout or memory format",
    ),
    Case(
        "keyword_with_code",
        "a keyword argument named after code",
        edited(FC1, FC1.replace("%fc1.weight))", "%fc1.weight), os.system=1)"), True),
        2,
        "has no argument `os.system`",
    ),
    Case(
        "getitem_with_code",
        "an index that is not an integer",
        edited(FC1, FC1.replace("%x,", 'operator.getitem(%x, "__class__"),'), True),
        2,
        "takes a value and an integer index",
    ),
    Case(
        "device_kind_with_code",
        "a device kind that would close its string",
        edited(
            "aten.sum.dim_IntList(%grad_output.0, [0], True)",
            "aten.sum.dim_IntList(%grad_output.0, [torch.device(\"cpu'); "
            + CODE.replace('"', '\\"')
            + "; ('\")], True)",
            True,
        ),
        2,
        "`torch.device` takes one device kind",
    ),
    Case(
        "constant_call",
        "a constant input that is a call",
        constant(_arg_call("os.system", "touch sentinel")),
        2,
        "must be None, True, False, a number or a string",
    ),
    Case("constant_string_breakout", "a constant input whose string closes quotes", constant(BREAKOUT_QUOTE)),
    Case(
        "dtype_with_code",
        "a tensor whose dtype is code",
        edited(
            "  fc1                               [16, 64]  float32",
            "  fc1                               [16, 64]  os.system",
            True,
        ),
        2,
        "unknown dtype `os.system`",
    ),
    # --- comments and names ---------------------------------------------------------------
    Case(
        "comments_with_template_syntax",
        "comments holding quotes and template syntax, not sealed",
        edited(
            "  compute  fc1\n",
            '  # """ {{ "pwn" ~ "ed" }} {% raw %} {# #} \'\'\' sentinel\n  compute  fc1  # """ {{ "pwn" ~ "ed" }}\n',
        ),
    ),
    Case(
        "names_like_the_module",
        "tensors named as the module's own names and builtins",
        sealed(
            lambda p: _renamed(p, {"fc1": "torch", "relu": "len", "drop": "_Step", "fc2": "FastModel", "head": "out_0"})
        ),
    ),
)


def _renamed(plan, names: dict[str, str]):
    """`plan` with ops and their tensors renamed (whole names and their `:k` outputs)."""
    from remat_dsl.plan import ir

    def name(n: str) -> str:
        stem, colon, k = n.partition(":")
        return names.get(stem, stem) + colon + k

    def arg(a):
        if isinstance(a, ir.Ref):
            return ir.Ref(name(a.name))
        if isinstance(a, ir.Call):
            return replace(a, args=tuple(arg(x) for x in a.args), kwargs=tuple((k, arg(v)) for k, v in a.kwargs))
        if isinstance(a, (ir.ListArg, ir.TupleArg)):
            return replace(a, items=tuple(arg(x) for x in a.items))
        return a

    g = plan.graph
    graph = replace(
        g,
        tensors=tuple(replace(t, name=name(t.name), producer=name(t.producer)) for t in g.tensors),
        ops=tuple(
            replace(
                o,
                name=name(o.name),
                outputs=tuple(map(name, o.outputs)),
                args=tuple(map(arg, o.args)),
                kwargs=tuple((k, arg(v)) for k, v in o.kwargs),
            )
            for o in g.ops
        ),
        outputs=arg(g.outputs),
        gradients=tuple(replace(gr, value=arg(gr.value)) for gr in g.gradients),
    )
    schedule = lambda section: tuple(replace(i, target=name(i.target)) for i in section)  # noqa: E731
    return replace(plan, graph=graph, forward=schedule(plan.forward), backward=schedule(plan.backward))


def write_corpus() -> None:
    for old in HERE.glob("*.plan"):
        old.unlink()
    for case in CASES:
        (HERE / f"{case.name}.plan").write_text(case.make(), encoding="utf-8")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write_corpus()
    print(f"wrote {len(CASES)} plans")
