"""Write ``breast_cancer.csv``: scikit-learn's bundled Breast Cancer Wisconsin
(Diagnostic) table, split for three hospitals.

    python examples/tabular/make_data.py        # rewrites the shipped file

569 tumours, 30 real-valued features, label 0 = malignant (212), 1 = benign (357).
Deterministic: a stratified 30% test split (``random_state=0``) and a Dirichlet
label split (alpha 1.0, seed 0) of the other rows over 3 clients, the usual way to
make a non-IID federation from a table without a natural partition (Hsu et al.
2019). Features are standardised with the training rows' mean and standard
deviation, rounded to 6 significant digits: the preprocessing is published with the
data, as a federation would agree on it before training (the scaling is not learnt
by the model).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

from fedplat.data import dirichlet

CLIENTS = 3
ALPHA = 1.0
SEED = 0
PATH = Path(__file__).with_name("breast_cancer.csv")


def table_text() -> str:
    """The CSV text: ``f0..f29, label, split, client`` (client -1 on test rows)."""
    bunch = load_breast_cancer()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    train, test = train_test_split(
        np.arange(len(y)), test_size=0.3, stratify=y, random_state=SEED
    )
    mean, std = x[train].mean(0), x[train].std(0)
    xs = (x - mean) / std
    client = np.full(len(y), -1)
    for c, part in enumerate(dirichlet(y[train], CLIENTS, ALPHA, SEED, min_size=40)):
        client[train[part]] = c
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*(f"f{i}" for i in range(x.shape[1])), "label", "split", "client"])
    is_test = np.zeros(len(y), dtype=bool)
    is_test[test] = True
    for i in range(len(y)):
        w.writerow(
            [
                *(f"{v:.6g}" for v in xs[i]),
                int(y[i]),
                "test" if is_test[i] else "train",
                int(client[i]),
            ]
        )
    return out.getvalue()


if __name__ == "__main__":
    PATH.write_text(table_text())
    print(f"wrote {PATH} ({PATH.stat().st_size} bytes)")
