"""The bundled 8x8 digits (no download), scaled to 0..1 and split 75/25: $KILN_OUTPUT_DIR/digits.npz."""

import os

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

out = os.environ.get("KILN_OUTPUT_DIR", "outputs")
os.makedirs(out, exist_ok=True)
x, y = load_digits(return_X_y=True)
x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.25, random_state=0, stratify=y)
np.savez(os.path.join(out, "digits.npz"), x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
print(f"rows={len(x)} train={len(x_train)} test={len(x_test)}", flush=True)
