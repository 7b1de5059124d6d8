"""The optimizer settings of the recurrent-memory authors (training/train_state.py):
AdamW, HuggingFace's linear schedule with warmup and torch's value clipping,
step for step against torch's own (CPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer_xl import default_config
from transformer_xl.training import train_state

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def train_cfg(**changes):
  t = default_config.get_config().train
  t.update(changes)
  return t


@pytest.mark.parametrize("warmup, span, min_lr", [(10, 40, 0.0), (0, 0, 0.0), (5, 0, 1e-4)])
def test_the_linear_schedule_is_huggingfaces_with_warmup(warmup, span, min_lr):
  t = train_cfg(
      learning_rate=1e-3, min_lr=min_lr, warmup_steps=warmup, num_steps=30,
      schedule="linear", schedule_steps=span,
  )  # fmt: skip
  ours = train_state.learning_rate_schedule(t)
  total = span or 30
  if min_lr:  # HuggingFace's decays to 0: a line from lr to min_lr by hand
    want = [
        1e-3 * s / warmup if s < warmup else max(min_lr, 1e-3 - (1e-3 - min_lr) * (s - warmup) / (total - warmup))
        for s in range(50)
    ]  # fmt: skip
  else:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
    want = []
    for _ in range(50):  # the rate of optimizer step s, then the scheduler's step
      want.append(opt.param_groups[0]["lr"])
      opt.step()
      sched.step()
  np.testing.assert_allclose([float(ours(s)) for s in range(50)], want, rtol=1e-6, atol=1e-12)


def test_adamw_with_value_clipping_equals_torch_step_for_step():
  """Ten steps of a small least-squares problem whose gradients exceed the
  clip: torch's clip_grad_value_ then AdamW with HuggingFace's schedule,
  and ours (clip_value, weight_decay, schedule="linear", no norm clip)."""
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=6).astype(np.float32) * 5
  w0 = rng.normal(size=4).astype(np.float32)
  t = train_cfg(
      learning_rate=0.05, warmup_steps=3, num_steps=10, schedule="linear", schedule_steps=20,
      clip=float("inf"), clip_value=1.0, weight_decay=0.01,
  )  # fmt: skip
  tx = train_state.make_optimizer(t)
  loss = lambda w: 0.5 * jnp.sum((jnp.asarray(a) @ w - b) ** 2)
  w, opt_state, ours = jnp.asarray(w0), None, []
  opt_state = tx.init(w)
  for _ in range(10):
    g = jax.grad(loss)(w)
    assert np.abs(np.asarray(g)).max() > 1.0  # the clip acts
    updates, opt_state = tx.update(g, opt_state, w)
    w = optax.apply_updates(w, updates)
    ours.append(np.asarray(w))
  p = torch.nn.Parameter(torch.tensor(w0))
  opt = torch.optim.AdamW([p], lr=0.05, weight_decay=0.01)
  sched = transformers.get_linear_schedule_with_warmup(opt, 3, 20)
  theirs = []
  for _ in range(10):
    opt.zero_grad()
    (0.5 * ((torch.tensor(a) @ p - torch.tensor(b)) ** 2).sum()).backward()
    torch.nn.utils.clip_grad_value_([p], 1.0)
    opt.step()
    sched.step()
    theirs.append(p.detach().numpy().copy())
  # float32 here, torch's learning rate and bias corrections in float64: 1e-5 apart.
  np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)
  # Without the weight decay the trajectory differs: the setting is used.
  plain = train_state.make_optimizer(train_cfg(**{**t.to_dict(), "weight_decay": 0.0}))
  u, _ = plain.update(jax.grad(loss)(jnp.asarray(w0)), plain.init(jnp.asarray(w0)), jnp.asarray(w0))
  u2, _ = tx.update(jax.grad(loss)(jnp.asarray(w0)), tx.init(jnp.asarray(w0)), jnp.asarray(w0))
  assert float(jnp.abs(u - u2).max()) == 0.0  # step 0: lr 0 under the warmup, both still
  assert not np.allclose(ours[-1], _run(plain, loss, w0))


def _run(tx, loss, w0, steps=10):
  w = jnp.asarray(w0)
  state = tx.init(w)
  for _ in range(steps):
    updates, state = tx.update(jax.grad(loss)(w), state, w)
    w = optax.apply_updates(w, updates)
  return np.asarray(w)


def test_bad_optimizer_settings_are_refused():
  config = default_config.get_config()
  config.train.update(schedule="step", schedule_steps=-1, clip_value=-1.0, weight_decay=-0.1)
  with pytest.raises(default_config.ConfigError) as err:
    default_config.validate(config, 1)
  text = str(err.value)
  for part in (
      "train.schedule='step': use 'cosine' or 'linear'",
      "train.schedule_steps=-1 must be an integer >= 0",
      "train.clip_value=-1.0 must be >= 0",
      "train.weight_decay=-0.1 must be >= 0",
  ):
    assert part in text, text
