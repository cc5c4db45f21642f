def sample_inputs():
    return ()
