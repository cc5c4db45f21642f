from _tiny import Small


def build_model():
    return Small()


def sample_inputs():
    return (load_batch(),)


def load_batch():
    raise FileNotFoundError("data/batch.pt")
