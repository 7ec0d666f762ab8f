"""A small PyTorch MLP learning a two-class spiral made on the fly (no download); saves the weights."""

import json
import math
import os

import torch
from torch import nn

torch.manual_seed(0)
out = os.environ.get("KILN_OUTPUT_DIR", "outputs")
os.makedirs(out, exist_ok=True)

n = 1000
t = torch.linspace(0, 3 * math.pi, n)
a = torch.stack([t * torch.cos(t), t * torch.sin(t)], dim=1) / 10
b = -a
x = torch.cat([a, b]) + 0.02 * torch.randn(2 * n, 2)
y = torch.cat([torch.zeros(n), torch.ones(n)]).long()

model = nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))
optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
epochs = int(os.environ.get("EPOCHS", "300"))
for step in range(1, epochs + 1):
    optimiser.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimiser.step()
    if step % 50 == 0:
        accuracy = (model(x).argmax(1) == y).float().mean().item()
        print(f"step={step} loss={loss.item():.4f} accuracy={accuracy:.4f}", flush=True)

accuracy = (model(x).argmax(1) == y).float().mean().item()
torch.save(model.state_dict(), os.path.join(out, "model.pt"))
with open(os.path.join(out, "metrics.json"), "w") as fh:
    json.dump({"accuracy": accuracy, "torch": torch.__version__}, fh)
print(f"saved model with accuracy {accuracy:.4f}")
