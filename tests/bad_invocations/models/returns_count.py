from torch import nn

from _tiny import inputs


class CountOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return {"hidden": self.fc(x).relu(), "count": 3}


def build_model():
    return CountOut()


sample_inputs = inputs
