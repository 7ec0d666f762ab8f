"""The replica server's built-in predictors inside the real catalog runtimes (``.cache/test-runtimes``; a missing
one is built through a Kiln server, as a job's first use would): a joblib scikit-learn model and a TorchScript MLP
answer over HTTP what the model itself answers in process, with batching on, and the sklearn model's
``n_features_in_`` becomes the input schema a wrong instance is refused by. Not exercised here: torch.export
(~25 s more on a loaded two-CPU machine, for one line of loader) and ONNX (no catalog runtime ships onnxruntime)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from kiln.injob import serve
from tests.kilnserver import TEST_RUNTIMES

pytestmark = pytest.mark.slow

SRC = str(Path(serve.__file__).resolve().parents[2])

TRAIN_SKLEARN = """
import json, sys, joblib
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
X, y = load_digits(return_X_y=True)
X = X / 16.0
model = LogisticRegression(max_iter=300).fit(X[:1000], y[:1000])
joblib.dump(model, sys.argv[1] + "/model.joblib")
sample = X[1000:1040]
print(json.dumps({"inputs": sample.tolist(), "outputs": model.predict(sample).tolist()}))
"""

TRAIN_TORCH = """
import json, sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval()
x = torch.randn(12, 4)
torch.jit.script(model).save(sys.argv[1] + "/model.pt")
with torch.no_grad():
    print(json.dumps({"inputs": x.tolist(), "outputs": model(x).tolist()}))
"""


def _runtime_python(make_server: Any, framework: str, name: str) -> Path:
    """The runtime's Python, built first through a Kiln server (an admin's ``runtimes install``) if missing."""
    venv = TEST_RUNTIMES / name
    if not (venv / ".kiln-ready").exists():
        client = make_server().client()
        client.install_runtime(framework)
        detail = client.wait_runtime(framework, timeout=900, poll=2)
        assert detail.status == "installed", "\n".join(client.runtime_log_lines(framework))
    return venv / "bin" / "python"


def _train(python: Path, script: str, model_dir: Path) -> dict[str, Any]:
    done = subprocess.run([str(python), "-c", script, str(model_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


class _Replica:
    """``python -m kiln.injob.serve`` under the runtime's Python, the kiln package on its path as in a job."""

    def __init__(self, python: Path, root: Path, **params: Any) -> None:
        root.mkdir(parents=True)
        (root / "params.json").write_text(json.dumps({"max_batch_size": 16, "max_latency_ms": 5, **params}))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "PYTHON", "VIRTUAL_ENV"))}
        env.update(
            KILN_PARAMS_FILE=str(root / "params.json"), KILN_WORK_DIR=str(root), PYTHONPATH=SRC, OMP_NUM_THREADS="1"
        )
        self.proc = subprocess.Popen(
            [str(python), "-m", "kiln.injob.serve"],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = self.proc.stdout.readline() if self.proc.stdout else ""
        if not ready:
            raise AssertionError(f"the replica exited with {self.proc.wait(30)}: {self.proc.communicate()[1]}")
        state = json.loads((root / serve.STATE_FILE).read_text())
        self.dir_fd = os.open(root, os.O_PATH | os.O_DIRECTORY)  # a short name for its Unix socket's directory
        self.client = httpx.Client(
            base_url="http://replica",
            transport=httpx.HTTPTransport(uds=f"/proc/self/fd/{self.dir_fd}/{state['socket']}"),
            headers={"Authorization": f"Bearer {state['secret']}"},
            timeout=120,
        )

    def predict(self, inputs: list[Any]) -> httpx.Response:
        return self.client.post("/predict", json={"inputs": inputs})

    def stop(self) -> int:
        self.client.close()
        os.close(self.dir_fd)
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=60)
        return self.proc.returncode


@pytest.mark.timeout(1200)  # a missing pytorch runtime is built first (up to 900 s); the predictions take seconds
def test_built_in_predictors_answer_what_the_model_answers(make_server, tmp_path: Path) -> None:
    sklearn_python = _runtime_python(make_server, "sklearn", "sklearn-1.9")
    torch_python = _runtime_python(make_server, "pytorch", "pytorch-2.13")

    sk_dir = tmp_path / "sk-model"
    sk_dir.mkdir()
    digits = _train(sklearn_python, TRAIN_SKLEARN, sk_dir)
    replica = _Replica(sklearn_python, tmp_path / "sk", model_dir=str(sk_dir), predictor="sklearn", model="digits@1")
    try:
        answer = replica.predict(digits["inputs"])
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"] == digits["outputs"]
        # No input_schema was given: the model's n_features_in_ (64) is the schema.
        short = replica.predict([digits["inputs"][0], digits["inputs"][1][:10]])
        assert short.status_code == 422
        assert short.json()["message"] == "inputs[1]: expected 64 numbers, got 10"
    finally:
        assert replica.stop() == 0

    torch_dir = tmp_path / "torch-model"
    torch_dir.mkdir()
    mlp = _train(torch_python, TRAIN_TORCH, torch_dir)
    replica = _Replica(torch_python, tmp_path / "torch", model_dir=str(torch_dir), predictor="torchscript")
    try:
        answer = replica.predict(mlp["inputs"])
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Kiln-Batch-Size"] == "12"
        outputs = answer.json()["outputs"]
        assert [len(row) for row in outputs] == [3] * 12
        for got, want in zip(outputs, mlp["outputs"], strict=True):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    finally:
        assert replica.stop() == 0
