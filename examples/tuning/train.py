"""A small neural network on scikit-learn's bundled digits data (no download), trained one epoch at a time.

It takes its hyperparameters from the command line and prints ``epoch=N val_acc=X`` after every epoch: that is
all a tuning study needs (study.yaml puts each trial's values in the command). The defaults are scikit-learn's.
"""

import argparse
import json
import os
import time
import warnings

import numpy as np
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

# The moves of a training image, nearest first: itself; one pixel up, left, right or down; then two pixels or
# diagonally (25 in all).
MOVES = sorted(((dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)), key=lambda m: (abs(m[0]) + abs(m[1]), m))

warnings.filterwarnings("ignore", category=ConvergenceWarning)  # one pass per partial_fit stops short on purpose


def moved_copies(images: np.ndarray, copies: int) -> np.ndarray:
    """``copies`` versions of every 8x8 image, moved as the first ``copies`` MOVES say (blank pixels come in)."""
    square = np.pad(images.reshape(-1, 8, 8), ((0, 0), (2, 2), (2, 2)))
    moved = [square[:, 2 - dy : 10 - dy, 2 - dx : 10 - dx] for dy, dx in MOVES[:copies]]
    return np.concatenate(moved).reshape(-1, 64)


def train(lr: float, width: int, alpha: float, epochs: int, copies: int = 5, seed: int = 0):
    """Train, yielding ``(epoch, validation accuracy)`` after each epoch (benchmarks/tuning.py runs the same
    training under Ray Tune by importing this)."""
    X, y = load_digits(return_X_y=True)
    X_train, X_val, y_train, y_val = train_test_split(X / 16.0, y, test_size=0.25, random_state=0, stratify=y)
    X_train, y_train = moved_copies(X_train, copies), np.tile(y_train, copies)
    classes = np.unique(y)
    model = MLPClassifier(hidden_layer_sizes=(width,), learning_rate_init=lr, alpha=alpha, random_state=seed)
    for epoch in range(1, epochs + 1):
        model.partial_fit(X_train, y_train, classes=classes)  # one pass over the training data, in mini-batches
        yield epoch, model.score(X_val, y_val)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lr", type=float, default=0.001, help="Adam's initial learning rate (learning_rate_init).")
    parser.add_argument("--width", type=int, default=100, help="Units of the one hidden layer.")
    parser.add_argument("--alpha", type=float, default=0.0001, help="L2 penalty.")
    parser.add_argument("--epochs", type=int, default=50, help="Passes over the training data.")
    parser.add_argument(
        "--copies",
        type=int,
        default=5,
        help="Versions of every training image, moved by a pixel or two (5: itself and its four one-pixel moves, as "
        f"scikit-learn's RBM example on these digits does; at most {len(MOVES)}). More copies, longer epochs.",
    )
    parser.add_argument("--seed", type=int, default=0, help="Initial weights and batch order.")
    args = parser.parse_args()
    if args.lr <= 0 or args.alpha < 0 or args.width < 1 or args.epochs < 1 or not 1 <= args.copies <= len(MOVES):
        parser.error(
            f"--lr must be > 0, --alpha at least 0, --width and --epochs at least 1, --copies 1 to {len(MOVES)}"
        )

    start = time.time()
    accuracy = 0.0
    for epoch, accuracy in train(args.lr, args.width, args.alpha, args.epochs, args.copies, args.seed):
        print(f"epoch={epoch} val_acc={accuracy:.4f}", flush=True)

    print(f"trained {args.epochs} epochs in {time.time() - start:.1f} s, final validation accuracy {accuracy:.4f}")
    out = os.environ.get("KILN_OUTPUT_DIR")
    if out:
        with open(os.path.join(out, "metrics.json"), "w") as fh:
            json.dump({"val_acc": accuracy, "lr": args.lr, "width": args.width, "alpha": args.alpha}, fh)


if __name__ == "__main__":
    main()
