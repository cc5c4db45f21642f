from torch import nn

from _tiny import inputs


class Keyed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, batch):
        return self.fc(batch["pixel-values"])


def build_model():
    return Keyed()


def sample_inputs():
    (x,) = inputs()
    return ({"pixel-values": x},)
