"""The solvers: each a remat_dsl.solve.api.Solver subclass that the registry names.

chain/: the chain solvers (rotor, checkpoint-sqrt) and the chain partition they share;
ilp/: the MILP solvers (checkmate, rockmate, hiremate, offmate) and their MILP runner;
twremat, moccasin (with stage_relaxation, its bound), autograd, and auto, which picks one.
"""
