"""Train a digits classifier with scikit-learn and leave behind what serving it needs.

Writes to $KILN_OUTPUT_DIR (``outputs`` when run by hand):

- ``model.joblib``: a LogisticRegression on scikit-learn's bundled 8x8 digits (no download), inputs scaled to
  0..1, 64 features per instance. Register it with
  ``kiln models register digits --from-job JOB --path model.joblib --framework sklearn``.
- ``expected.json``: ``{"inputs": [...], "outputs": [...]}``, held-out instances and the model's own ``predict``
  on them: a served version must answer the same.
- ``digits.npz``: the same train/test split as float32 arrays (``x_train``, ``y_train``, ``x_test``,
  ``y_test``), for the PyTorch example (``train_torch.py``), whose runtime has no scikit-learn: put it as the
  dataset ``digits`` (``kiln data put digits.npz digits``).
"""

import json
import os

import joblib
import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

EXPECTED = 32  # held-out instances written to expected.json

out = os.environ.get("KILN_OUTPUT_DIR", "outputs")
os.makedirs(out, exist_ok=True)

x, y = load_digits(return_X_y=True)
# x / 16 is exact in float32 and float64 alike: the served model gets the very values it was tested on.
x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.25, random_state=0, stratify=y)
model = LogisticRegression(max_iter=500)
model.fit(x_train, y_train)
accuracy = model.score(x_test, y_test)
print(f"accuracy={accuracy:.4f}", flush=True)

joblib.dump(model, os.path.join(out, "model.joblib"))
inputs = x_test[:EXPECTED]
with open(os.path.join(out, "expected.json"), "w") as fh:
    json.dump({"inputs": inputs.tolist(), "outputs": model.predict(inputs).tolist()}, fh)
np.savez(
    os.path.join(out, "digits.npz"),
    x_train=x_train.astype(np.float32),
    y_train=y_train,
    x_test=x_test.astype(np.float32),
    y_test=y_test,
)
print(f"saved model.joblib, expected.json ({EXPECTED} instances) and digits.npz", flush=True)
