from torch import nn

from _tiny import inputs


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return {"hidden": self.fc(x).relu()}


def build_model():
    return DictOut()


sample_inputs = inputs
