"""Chain solvers: the chain partition and model, Rotor, RK-Rotor and checkpoint-sqrt."""
