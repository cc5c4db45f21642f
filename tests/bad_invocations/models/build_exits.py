import sys


def build_model():
    sys.exit(4)


def sample_inputs():
    return ()
