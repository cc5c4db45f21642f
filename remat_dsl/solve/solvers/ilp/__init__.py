"""MILP solvers: the backends, the H-ILP, Checkmate, Rockmate's blocks, HiRemate's hierarchy."""
