from torch import nn


def build_model():
    return nn.Linear(8, 8)
