"""The one table of instructions (ir.INSTRUCTIONS) against every stage that acts on verbs.

Each stage keeps its own code but dispatches through a table keyed by verb: the replay's
HANDLERS, codegen's EMITTERS, `remat show`'s RUG, `remat diff`'s POLICIES.  A verb added to
ir.INSTRUCTIONS fails here until every stage says what it does with it; a verb a stage
knows but the table does not fails too.
"""

from __future__ import annotations

import pytest

from remat_dsl.check import replay
from remat_dsl.codegen import generate
from remat_dsl.plan import ir, parser
from remat_dsl.review import diff, show

STAGE_TABLES = {
    "check.replay.HANDLERS": replay.HANDLERS,
    "codegen.generate.EMITTERS": generate.EMITTERS,
    "review.show.RUG": show.RUG,
    "review.diff.POLICIES": diff.POLICIES,
}


@pytest.mark.parametrize("table", STAGE_TABLES, ids=list(STAGE_TABLES))
def test_every_stage_has_every_verb_and_no_other(table):
    keys = set(STAGE_TABLES[table])
    assert keys >= set(ir.INSTRUCTIONS), f"{table} lacks {sorted(set(ir.INSTRUCTIONS) - keys)}"
    assert keys <= set(
        ir.INSTRUCTIONS
    ), f"{table} has verbs ir.INSTRUCTIONS does not declare: {sorted(keys - set(ir.INSTRUCTIONS))}"


def test_handlers_are_callable_methods_of_their_stage():
    for verb in ir.INSTRUCTIONS:
        assert replay.HANDLERS[verb].__qualname__ == f"_Simulator._{verb}"
        assert generate.EMITTERS[verb].__qualname__ == f"_Renderer._{verb}"


def test_declarations_are_consistent():
    for name, verb in ir.INSTRUCTIONS.items():
        assert verb.name == name
        assert verb.operand in ("op", "tensor", "parameter")
        assert verb.stream in ir.STREAMS
        assert not verb.runs_op or verb.operand == "op", f"{name} runs an op but does not name one"
        assert not (verb.runs_op and verb.transfer)
    assert ir.VERBS == tuple(ir.INSTRUCTIONS)
    assert ir.VERB_STREAM == {name: verb.stream for name, verb in ir.INSTRUCTIONS.items()}


def test_aliases_are_unique_and_not_verbs():
    aliases = [alias for verb in ir.INSTRUCTIONS.values() for alias in verb.aliases]
    assert len(aliases) == len(set(aliases))
    assert not set(aliases) & set(ir.INSTRUCTIONS)
    assert parser.VERB_ALIASES == {alias: verb.name for verb in ir.INSTRUCTIONS.values() for alias in verb.aliases}


@pytest.mark.parametrize("verb", list(ir.INSTRUCTIONS))
def test_instruction_queries_follow_the_table(verb):
    ins = ir.Instruction(verb, "x", ir.INSTRUCTIONS[verb].stream)
    assert ins.runs_op == ir.INSTRUCTIONS[verb].runs_op
    assert ins.is_transfer == ir.INSTRUCTIONS[verb].transfer


def test_an_unknown_verb_neither_runs_nor_transfers():
    ins = ir.Instruction("run", "x", ir.COMPUTE_STREAM)
    assert not ins.runs_op and not ins.is_transfer
