"""The trained model ($KILN_INPUT_TRAIN/model.joblib) on prep's held-out split: ``val_acc=...`` (a metric the
pipeline's deploy step is gated on), and expected.json: held-out instances and the model's own predictions,
which the deployed service must answer alike."""

import json
import os

import joblib
import numpy as np

data = np.load(os.path.join(os.environ["KILN_INPUT_PREP"], "digits.npz"))
model = joblib.load(os.path.join(os.environ["KILN_INPUT_TRAIN"], "model.joblib"))
print(f"val_acc={model.score(data['x_test'], data['y_test']):.4f}", flush=True)
inputs = data["x_test"][:32]
out = os.environ.get("KILN_OUTPUT_DIR", "outputs")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "expected.json"), "w") as fh:
    json.dump({"inputs": inputs.tolist(), "outputs": model.predict(inputs).tolist()}, fh)
