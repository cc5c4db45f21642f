from _tiny import Small


def build_model():
    return Small()


def sample_inputs():
    return None
