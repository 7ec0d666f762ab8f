"""Train a small MLP on the digits in PyTorch and save it as TorchScript, ready to serve.

Reads the dataset ``digits`` (``digits.npz``, written by ``train_sklearn.py``: the pytorch runtime has no
scikit-learn to load the digits with), staged by the job's ``inputs`` where ``$KILN_INPUT_DIGITS`` says. Writes to
$KILN_OUTPUT_DIR (``outputs`` when run by hand):

- ``model.pt``: ``torch.jit.script`` of the network; it takes a float32 batch of shape (N, 64) and returns the
  10 class scores (logits) of each instance. Register it with
  ``kiln models register digits-torch --from-job JOB --path model.pt --framework torch``.
- ``expected.json``: ``{"inputs": [...], "outputs": [...]}``, held-out instances and the scripted model's own
  answer on them: a served version must answer the same.

``--width`` and ``--layers`` size the network (benchmarks/serving.py serves a wide one to measure batching).
"""

import argparse
import json
import os

import numpy as np
import torch
from torch import nn

EXPECTED = 32  # held-out instances written to expected.json

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument(
    "--data",
    default=os.path.join(os.environ.get("KILN_INPUT_DIGITS", "data/digits"), "digits.npz"),
    help="The digits.npz of train_sklearn.py (default: in the staged dataset digits).",
)
parser.add_argument("--width", type=int, default=64, help="Units of each hidden layer.")
parser.add_argument("--layers", type=int, default=2, help="Hidden layers.")
parser.add_argument("--steps", type=int, default=300, help="Full-batch Adam steps.")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
if args.width < 1 or args.layers < 1 or args.steps < 0:
    parser.error("--width and --layers must be at least 1, --steps at least 0")

torch.manual_seed(args.seed)
out = os.environ.get("KILN_OUTPUT_DIR", "outputs")
os.makedirs(out, exist_ok=True)

data = np.load(args.data)
x_train, y_train = torch.from_numpy(data["x_train"]), torch.from_numpy(data["y_train"]).long()
x_test, y_test = torch.from_numpy(data["x_test"]), torch.from_numpy(data["y_test"]).long()

layers: list[nn.Module] = []
width_in = x_train.shape[1]
for _ in range(args.layers):
    layers += [nn.Linear(width_in, args.width), nn.ReLU()]
    width_in = args.width
model = nn.Sequential(*layers, nn.Linear(width_in, 10))
optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
for step in range(1, args.steps + 1):
    optimiser.zero_grad()
    loss = loss_fn(model(x_train), y_train)
    loss.backward()
    optimiser.step()
    if step % 50 == 0 or step == args.steps:
        print(f"step={step} loss={loss.item():.4f}", flush=True)

model.eval()
scripted = torch.jit.script(model)
with torch.no_grad():
    accuracy = (scripted(x_test).argmax(1) == y_test).float().mean().item()
    inputs = x_test[:EXPECTED]
    outputs = scripted(inputs)
print(f"accuracy={accuracy:.4f}", flush=True)
scripted.save(os.path.join(out, "model.pt"))
with open(os.path.join(out, "expected.json"), "w") as fh:
    json.dump({"inputs": inputs.tolist(), "outputs": outputs.tolist()}, fh)
print(f"saved model.pt ({sum(p.numel() for p in model.parameters())} parameters) and expected.json", flush=True)
