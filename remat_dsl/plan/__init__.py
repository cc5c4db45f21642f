"""Stage plan: the plan language every other stage speaks (IR, units, grammar, parser, printer, digest)."""
