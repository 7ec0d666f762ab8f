"""A LogisticRegression on prep's split ($KILN_INPUT_PREP/digits.npz): $KILN_OUTPUT_DIR/model.joblib."""

import os

import joblib
import numpy as np
from sklearn.linear_model import LogisticRegression

data = np.load(os.path.join(os.environ["KILN_INPUT_PREP"], "digits.npz"))
model = LogisticRegression(max_iter=500)
model.fit(data["x_train"], data["y_train"])
out = os.environ.get("KILN_OUTPUT_DIR", "outputs")
os.makedirs(out, exist_ok=True)
joblib.dump(model, os.path.join(out, "model.joblib"))
print(f"train_acc={model.score(data['x_train'], data['y_train']):.4f}", flush=True)
