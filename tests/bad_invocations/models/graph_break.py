from torch import nn

from _tiny import inputs


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:  # a branch on a tensor's value: not one graph
            return y.relu()
        return y


def build_model():
    return Branchy()


sample_inputs = inputs
