from types import SimpleNamespace

from torch import nn

from _tiny import inputs


class Namespaced(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, batch):
        return self.fc(batch.x)


def build_model():
    return Namespaced()


def sample_inputs():
    (x,) = inputs()
    return (SimpleNamespace(x=x),)
