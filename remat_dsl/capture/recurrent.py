"""Recurrent layers (`nn.LSTM`, `nn.GRU`, `nn.RNN`) captured as eager runs them.

NOTE: [Recurrent layers]
Dynamo refuses `nn.LSTM`, `nn.GRU` and `nn.RNN` unless `torch._dynamo.config.allow_rnn` is
set; with it, the graph holds `aten.lstm`/`aten.gru`/`aten.rnn_tanh`/`aten.rnn_relu`, and
AOTAutograd decomposes them with PyTorch's own decompositions (torch._decomp.decompositions:
`lstm_impl`, `gru_impl`, `rnn_tanh_input`, `rnn_relu_input`, all through `_rnn_helper`).
Those are the ops eager runs on CPU for GRU, RNN and LSTM with `proj_size` (a linear over
the whole sequence, then one cell per step), and they train bit for bit.  Two places differ
from eager, and `recurrent_layers()` replaces them while the model is captured:

- LSTM without projections: eager (aten/src/ATen/native/RNN.cpp, `use_mkldnn`) runs oneDNN's
  `mkldnn_rnn_layer` on CPU for float32 (bfloat16 where the CPU has it) whether or not a
  gradient is wanted, and `mkldnn_rnn_layer_backward` on the workspace it saves.  PyTorch's
  decomposition takes oneDNN only for inference (`train=False`, no workspace) and the per-step
  cell otherwise, whose bits differ.  `_lstm_layer_function` keeps the per-step cell where eager
  runs it (projections, other dtypes) and otherwise calls `mkldnn_rnn_layer` as eager does:
  one call per layer and direction on the sequence-first input, 2-D hidden states, zeros of
  the weights' sizes for absent biases, and the module's own `num_layers`, `bidirectional`,
  `batch_first` and `train`.  Its workspace is made only in grad mode (NOTE: [oneDNN
  workspace] in remat_dsl/plan/operators.py).
- Dropout between layers: `_rnn_helper` never applies it (its condition `num_layers < i - 1`
  is never true); `_rnn_helper` here applies `dropout` after every layer but the last in
  training, as eager's layer stack does.
"""

from __future__ import annotations

import contextlib
from itertools import chain

import torch

from remat_dsl.plan.operators import GRAD_MODE_OPS


@contextlib.contextmanager
def recurrent_layers():
    """While captured, let dynamo take recurrent layers and AOTAutograd decompose them into
    the ops eager runs (NOTE: [Recurrent layers])."""
    import torch._dynamo.config
    from torch._decomp import decompositions

    with contextlib.ExitStack() as stack:
        stack.enter_context(torch._dynamo.config.patch(allow_rnn=True))
        for name, replacement in (
            ("select_one_layer_lstm_function", _lstm_layer_function),
            ("_rnn_helper", _rnn_helper),
            ("gru_cell", _gru_cell),
        ):
            original = getattr(decompositions, name)
            setattr(decompositions, name, replacement)
            stack.callback(setattr, decompositions, name, original)
        yield


def _eager_uses_onednn(input: torch.Tensor, hx, params) -> bool:
    """Whether eager's `aten.lstm` runs oneDNN on these arguments (RNN.cpp: `use_mkldnn`, no
    projections)."""
    if not torch._C._get_mkldnn_enabled() or input.numel() == 0:
        return False
    tensors = [input, *hx, *chain.from_iterable(params)]
    if any(t.device.type != "cpu" for t in tensors):
        return False
    if hx[0].size(2) != hx[1].size(2):  # projections: eager runs the per-step cell
        return False
    if input.dtype == torch.float32:
        return True
    return input.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _lstm_layer_function(input, hx, params):
    """The decomposition of one LSTM layer: PyTorch's per-step cell where eager runs it, eager's
    oneDNN layer where eager runs that (NOTE: [Recurrent layers])."""
    from torch._decomp import decompositions

    return _OneDNNLayer() if _eager_uses_onednn(input, hx, params) else decompositions.one_layer_lstm


class _OneDNNLayer:
    """One LSTM layer as eager runs it through oneDNN (aten/src/ATen/native/mkldnn/RNN.cpp,
    `mkldnn_rnn`): `aten.mkldnn_rnn_layer` on the sequence-first input, with the module's own
    `num_layers`, `bidirectional`, `batch_first` and `train`, which `_rnn_helper` binds."""

    flags: tuple[int, bool, bool, bool] = (1, False, False, False)

    def bind(self, num_layers: int, bidirectional: bool, batch_first: bool, train: bool) -> "_OneDNNLayer":
        self.flags = (num_layers, bidirectional, batch_first, train)
        return self

    def __call__(self, inp, hidden, params, has_biases, reverse=False):
        num_layers, bidirectional, batch_first, train = self.flags
        w0, w1 = params[0], params[1]
        # without biases, eager passes zeros of the weights' sizes in their place
        w2, w3 = (params[2], params[3]) if has_biases else (torch.zeros_like(w0), torch.zeros_like(w1))
        hx, cx = hidden
        out, hy, cy, _ = torch.ops.aten.mkldnn_rnn_layer.default(
            inp.contiguous(), w0, w1, w2, w3, hx, cx, reverse, [], 2, hx.size(-1), num_layers, has_biases,
            bidirectional, batch_first, train,
        )  # fmt: skip
        return out, (hy, cy)


def call_op(target, args, kwargs):
    """`target(*args, **kwargs)`, in grad mode on detached arguments for GRAD_MODE_OPS
    (NOTE: [oneDNN workspace] in remat_dsl/plan/operators.py)."""
    if str(target) not in GRAD_MODE_OPS:
        return target(*args, **kwargs)
    detached = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.enable_grad():
        return target(*detached, **kwargs)


def _rnn_helper(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, layer_fn):
    """PyTorch's `_rnn_helper` with eager's dropout between layers."""
    from torch._decomp.decompositions import params_hiddens

    if isinstance(layer_fn, _OneDNNLayer):
        layer_fn = layer_fn.bind(num_layers, bidirectional, batch_first, train)
    input = input.transpose(0, 1) if batch_first else input
    final_hiddens = []
    for i in range(num_layers):
        cur_params, cur_hidden, bidir_params, bidir_hidden = params_hiddens(params, hidden, i, bidirectional)
        forward, forward_hidden = layer_fn(input, cur_hidden, cur_params, has_biases)
        final_hiddens.append(forward_hidden)
        if bidirectional:
            backward, backward_hidden = layer_fn(input, bidir_hidden, bidir_params, has_biases, reverse=True)
            final_hiddens.append(backward_hidden)
            input = torch.cat([forward, backward], forward.dim() - 1)
        else:
            input = forward
        if dropout != 0 and train and i < num_layers - 1:
            input = torch.dropout(input, dropout, train=True)
    input = input.transpose(0, 1) if batch_first else input
    return input, final_hiddens


def _gru_cell(inp, cur_hidden, ih_weight, ih_bias, hh_weight, hh_bias):
    """PyTorch's `gru_cell` with its reset and update gates' sigmoids run on views in rows of
    the hidden size, as eager's in-place `sigmoid_` on its gates' chunks (NOTE: [Recurrent
    layers])."""
    import torch.nn.functional as F

    size = cur_hidden.size(-1)
    hidden_rz, hidden_n = F.linear(cur_hidden, hh_weight, hh_bias).split([2 * size, size], -1)
    input_rz, input_n = inp.split([2 * size, size], -1)
    reset, update = (hidden_rz + input_rz).chunk(2, -1)
    reset_gate, update_gate = reset.sigmoid(), update.sigmoid()
    new_gate = (input_n + hidden_n * reset_gate).tanh()
    return (cur_hidden - new_gate) * update_gate + new_gate
