"""Train a classifier on scikit-learn's bundled digits data (no download) and save it as a Kiln artifact."""

import json
import os
import pickle
import time
import warnings

from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

warnings.filterwarnings("ignore", category=ConvergenceWarning)  # the early epochs stop short on purpose

out = os.environ.get("KILN_OUTPUT_DIR", "outputs")
os.makedirs(out, exist_ok=True)

X, y = load_digits(return_X_y=True)
X_train, X_test, y_train, y_test = train_test_split(X / 16.0, y, test_size=0.25, random_state=0)
start = time.time()
model = LogisticRegression(max_iter=1000)
for epoch, max_iter in enumerate((20, 50, 200), start=1):
    model.set_params(max_iter=max_iter, warm_start=True)
    model.fit(X_train, y_train)
    print(
        f"epoch {epoch}/3 - loss: {1 - model.score(X_train, y_train):.4f} - accuracy: {model.score(X_test, y_test):.4f}"
    )

accuracy = model.score(X_test, y_test)
with open(os.path.join(out, "model.pkl"), "wb") as fh:
    pickle.dump(model, fh)
with open(os.path.join(out, "metrics.json"), "w") as fh:
    json.dump({"accuracy": accuracy, "train_seconds": time.time() - start}, fh)
print(f"saved model with test accuracy {accuracy:.4f}")
