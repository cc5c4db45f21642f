"""Rematerialization solvers: chain models (`chain`), rotor's dynamic program (`rotor`) and
Chen et al.'s sqrt(n) segments (`sqrt`), all returning a `chain.ChainSchedule`."""
