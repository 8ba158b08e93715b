"""scikit-learn's MLPClassifier on the train_digits set-up, for a same-run ratio.

64-256-256-10, ReLU, Adam lr 1e-3, batch 128, 30 epochs, seed 0, 80/20
stratified split, standardised on the training part. Prints lines of the
same form as `cargo run --release -p training --example train_digits`.

    python3 -m venv /tmp/sk && /tmp/sk/bin/pip install scikit-learn
    /tmp/sk/bin/python scripts/anchors/sklearn_digits.py
"""
import time
import warnings

from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

warnings.filterwarnings("ignore")  # "max_iter reached" is the point here
X, y = load_digits(return_X_y=True)
Xtr, Xva, ytr, yva = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
scaler = StandardScaler().fit(Xtr)
Xtr, Xva = scaler.transform(Xtr), scaler.transform(Xva)
for _ in range(3):
    clf = MLPClassifier(
        hidden_layer_sizes=(256, 256), activation="relu", solver="adam",
        learning_rate_init=1e-3, batch_size=128, max_iter=30, random_state=0,
        n_iter_no_change=1000, tol=0,
    )
    start = time.time()
    clf.fit(Xtr, ytr)
    seconds = time.time() - start
    print(f"sklearn val_accuracy={clf.score(Xva, yva):.4f} seconds={seconds:.3f}")
