"""Recurrent layers (`nn.GRU`, `nn.RNN`, `nn.LSTM` with `proj_size`) planned through the shell
and trained bit for bit against eager (NOTE: [Recurrent layers] in
remat_dsl/capture/recurrent.py); `nn.LSTM` without projections is refused with PyTorch's reason."""

from __future__ import annotations

import pytest

from tests.test_stock_models import MODELS, run_stock, shell


@pytest.mark.parametrize("name", ["gru_seq_first", "lstm_projected", "rnn_tanh"])
def test_recurrent_layers_plan_and_train_bit_for_bit(name, tmp_path):
    run_stock(name, tmp_path, ("100%",))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gru_seq_first", "lstm_projected"])
def test_recurrent_layers_at_110_percent_of_the_smallest_budget(name, tmp_path):
    run_stock(name, tmp_path, ("min",))


def test_an_lstm_eager_runs_through_onednn_is_refused_with_pytorchs_reason(tmp_path):
    result = shell(f"remat plan {MODELS / 'lstm_bidirectional.py'} --budget 100% > m.plan", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "lstm_bidirectional.py:19:" in result.stderr
    assert "nn.LSTM without proj_size cannot be captured" in result.stderr
    assert "Dynamo does not support RNN, GRU, or LSTM." in result.stderr
    assert (tmp_path / "m.plan").read_text() == ""
