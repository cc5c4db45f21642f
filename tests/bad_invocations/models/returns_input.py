from torch import nn

from _tiny import inputs


class Echo(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x).relu(), x


def build_model():
    return Echo()


sample_inputs = inputs
