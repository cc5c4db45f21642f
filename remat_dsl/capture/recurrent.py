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
  gradient is wanted, and saves its workspace for `mkldnn_rnn_layer_backward`.  PyTorch's
  decomposition takes oneDNN only for inference, and then with `train=False`, so a model whose
  input needs no gradient got a layer without a workspace that AOTAutograd cannot run
  backward through, and one whose input needs a gradient other bits (a per-step cell).
  `_lstm_layer_function` keeps PyTorch's per-step cell where eager runs it (projections,
  other dtypes) and refuses the oneDNN case: a layer through `mkldnn_rnn_layer` with
  `train=True` still reaches AOTAutograd's backward without its workspace.
- Dropout between layers: `_rnn_helper` never applies it (its condition `num_layers < i - 1`
  is never true); `_rnn_helper` here applies `dropout` after every layer but the last in
  training, as eager's layer stack does.
"""

from __future__ import annotations

import contextlib
from itertools import chain

import torch

from remat_dsl.plan.errors import RematError


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
    """The decomposition of one LSTM layer: PyTorch's per-step cell where eager runs it; refused
    where eager runs oneDNN (NOTE: [Recurrent layers])."""
    from torch._decomp import decompositions

    if not _eager_uses_onednn(input, hx, params):
        return decompositions.one_layer_lstm
    raise RematError(
        "error: nn.LSTM without proj_size cannot be captured: on CPU eager runs oneDNN's "
        "aten.mkldnn_rnn_layer, and the graph AOTAutograd makes of it saves no workspace for "
        'aten.mkldnn_rnn_layer_backward ("Expected a proper Tensor but got None ... for argument '
        '#22 \'workspace\'"); without allow_rnn dynamo says "Dynamo does not support RNN, GRU, or LSTM."',
        hint="set `torch.backends.mkldnn.enabled = False` at the top of the model file (eager then runs the "
        "per-step LSTM cells, which are captured bit for bit); nn.GRU, nn.RNN and nn.LSTM with proj_size are "
        "captured as they are; or write the loop with nn.LSTMCell",
    )


def _rnn_helper(input, hidden, params, has_biases, num_layers, dropout, train, bidirectional, batch_first, layer_fn):
    """PyTorch's `_rnn_helper` with eager's dropout between layers."""
    from torch._decomp.decompositions import params_hiddens

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
