"""DistributedDataParallel on CPU (gloo). Unchanged from a torchrun script: the process group reads
MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE, which Kiln sets for every worker.

Each rank starts from different random weights and sees its own data shard; DDP broadcasts rank 0's weights
at the start and averages gradients every step, so all ranks end with the same parameters. Each rank writes
a digest of its parameters to $KILN_OUTPUT_DIR/rank<N>.json.
"""

import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)  # different on purpose: DDP must make them equal
model = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.2)

generator = torch.Generator().manual_seed(1000 + rank)  # this rank's shard
x = torch.randn(1024, 2, generator=generator)
y = ((x[:, 0] * x[:, 1]) > 0).long()
loss_fn = torch.nn.CrossEntropyLoss()
steps = int(os.environ.get("STEPS", "200"))
for step in range(1, steps + 1):
    optimizer.zero_grad()
    loss = loss_fn(ddp(x), y)
    loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(f"rank={rank} step={step} loss={loss.item():.4f}", flush=True)

flat = torch.cat([p.detach().flatten() for p in model.parameters()])
digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
accuracy = (model(x).argmax(1) == y).float().mean().item()
with open(os.path.join(os.environ["KILN_OUTPUT_DIR"], f"rank{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "world_size": world, "digest": digest, "loss": loss.item(), "accuracy": accuracy}, fh)
print(f"rank={rank} done digest={digest[:16]} accuracy={accuracy:.3f}", flush=True)
dist.destroy_process_group()
# PyTorch 2.13 with gloo: a worker thread frees each collective's work object, under the GIL, just after the
# collective completes. If the interpreter is already shutting down by then, the process aborts (exit 134)
# after all its work is done, a few times in a hundred on a busy machine. A moment without the GIL lets it
# finish first.
time.sleep(0.5)
