from torch import nn

from _tiny import inputs


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)  # x has 8 features


def build_model():
    return Broken()


sample_inputs = inputs
