"""Recurrent layers (`nn.GRU`, `nn.RNN`, `nn.LSTM` with and without `proj_size`) planned through
the shell and trained bit for bit against eager (NOTE: [Recurrent layers] in
remat_dsl/capture/recurrent.py); an LSTM without projections runs oneDNN's layer, as eager does
on CPU (NOTE: [oneDNN workspace] in remat_dsl/plan/operators.py)."""

from __future__ import annotations

import pytest

from tests.test_stock_models import run_stock


@pytest.mark.parametrize(
    "name", ["gru_seq_first", "lstm_projected", "rnn_tanh", "lstm_bidirectional", "lstm_language_model"]
)
def test_recurrent_layers_plan_and_train_bit_for_bit(name, tmp_path):
    run_stock(name, tmp_path, ("100%",))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gru_seq_first", "lstm_projected", "lstm_language_model", "lstm_cell"])
def test_recurrent_layers_at_110_percent_of_the_smallest_budget(name, tmp_path):
    run_stock(name, tmp_path, ("min",))
