"""Trainers people use train `remat_dsl.fast_model(model, plan)` without changes to their
loop (NOTE: [Trainers] in remat_dsl/codegen/runtime.py): Hugging Face `Trainer` on a stock
GPT-2 (tied embeddings) gives eager's losses and parameters bit for bit, and its checkpoint,
keyed as the model's own, loads into the model."""

from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch

import remat_dsl

transformers = pytest.importorskip("transformers")
needs_accelerate = pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None,
    reason="Hugging Face Trainer and Accelerate loops need accelerate, which is not installed (pip install accelerate)",
)

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

VOCAB, SEQ, BATCH, STEPS = 256, 32, 2, 5


def build_model() -> GPT2LMHeadModel:
    """A stock GPT-2 from a config (no download), dropout on, tied embeddings."""
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=SEQ, vocab_size=VOCAB, bos_token_id=0,
                        eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config).train()


class Tokens(torch.utils.data.Dataset):
    """Ten random sequences: what Trainer batches, shuffles and feeds as `input_ids` and `labels`."""

    def __init__(self):
        self.ids = torch.randint(0, VOCAB, (10, SEQ), generator=torch.Generator().manual_seed(5))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Losses(TrainerCallback):
    def __init__(self):
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


@pytest.fixture(scope="module")
def plan():
    """The plan Trainer's calls need: the batch's `input_ids` and `labels`, and the
    `num_items_in_batch` Trainer passes (a 0-dim float32 tensor: the tokens the loss counts)."""
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "labels": ids, "num_items_in_batch": torch.tensor(float(BATCH * SEQ))}
    planned = remat_dsl.plan_model(build_model(), inputs, "80%", loss_fn=lambda out: out.loss, solver="rotor")
    assert any(i.verb == "recompute" for i in planned.backward)  # the plan does recompute
    return planned


def train(model: torch.nn.Module, out) -> list[float]:
    losses = Losses()
    args = TrainingArguments(
        str(out), max_steps=STEPS, per_device_train_batch_size=BATCH, logging_steps=1, report_to=[], seed=0,
        save_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[losses])
    trainer.train()
    trainer.save_model(str(out / "final"))
    return losses.losses


@needs_accelerate
def test_trainer_trains_the_plan_as_it_trains_the_model(plan, tmp_path):
    eager = build_model()
    expected = train(eager, tmp_path / "eager")
    model = build_model()
    fast = remat_dsl.fast_model(model, plan)
    assert "input_ids" in inspect.signature(fast.forward).parameters and fast.config is model.config
    assert train(fast, tmp_path / "fast") == expected and len(expected) == STEPS
    for (name, a), b in zip(eager.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name
    # the checkpoint Trainer wrote has the model's keys and loads into a fresh model
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "fast" / "final" / "model.safetensors"))
    assert set(saved) == set(model.state_dict())
    fresh = build_model()
    fresh.load_state_dict(saved)
    for (name, a), b in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(a, b), name


def accelerate_steps(model: torch.nn.Module) -> list[float]:
    """A loop written for Accelerate: `prepare`, then `accelerator.backward(loss)`."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(0)
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=BATCH, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for batch in loader:
        optimizer.zero_grad()
        loss = model(**batch, num_items_in_batch=torch.tensor(float(BATCH * SEQ))).loss
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    return losses


@needs_accelerate
def test_an_accelerate_loop_trains_the_plan_as_it_trains_the_model(plan):
    eager, model = build_model(), build_model()
    assert accelerate_steps(remat_dsl.fast_model(model, plan)) == accelerate_steps(eager)
    for (name, a), b in zip(eager.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name


def lightning_steps(model: torch.nn.Module, checkpoint=None) -> list[float]:
    """A LightningModule as its authors write one around a Hugging Face model, `fit` for
    STEPS steps; the losses of its training steps.  checkpoint: where to save it after."""
    import lightning

    class Module(lightning.LightningModule):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def training_step(self, batch, index):
            return self.net(**batch, num_items_in_batch=torch.tensor(float(BATCH * SEQ))).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Losses(lightning.Callback):
        def __init__(self):
            self.losses: list[float] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, index):
            self.losses.append(outputs["loss"].item())

    lightning.seed_everything(0)
    losses = Losses()
    trainer = lightning.Trainer(
        max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[losses],
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=BATCH, shuffle=True)
    trainer.fit(Module(model), loader)
    if checkpoint is not None:
        trainer.save_checkpoint(checkpoint)
    return losses.losses


def test_lightning_trains_the_plan_as_it_trains_the_model(plan, tmp_path):
    if importlib.util.find_spec("lightning") is None:
        pytest.skip("PyTorch Lightning is not installed (pip install lightning)")
    eager, model = build_model(), build_model()
    expected = lightning_steps(eager)
    assert lightning_steps(remat_dsl.fast_model(model, plan), tmp_path / "fast.ckpt") == expected
    assert len(expected) == STEPS
    for (name, a), b in zip(eager.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name
    # the LightningModule's checkpoint has the keys of one around the model itself
    saved = torch.load(tmp_path / "fast.ckpt", weights_only=False)["state_dict"]
    assert set(saved) == {f"net.{key}" for key in model.state_dict()}
