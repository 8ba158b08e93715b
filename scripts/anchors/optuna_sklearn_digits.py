"""Optuna 5 TPE tuning scikit-learn's MLPClassifier on the digits: the
32-trial study of docs/benchmarks/digits-study.md (width 32-512 log,
depth 1-3, lr 1e-4..1e-1 log, L2 1e-6..1e-2 log, batch {32, 64, 128}, 30 epochs, seed 0), for a
same-run ratio against `studies/digits.toml` with `kind = "tpe"`.

    .venv/bin/python scripts/anchors/optuna_sklearn_digits.py [N_JOBS]
"""
import sys, time, warnings
import optuna
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

warnings.filterwarnings("ignore")
optuna.logging.set_verbosity(optuna.logging.WARNING)
X, y = load_digits(return_X_y=True)
Xtr, Xva, ytr, yva = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
s = StandardScaler().fit(Xtr)
Xtr, Xva = s.transform(Xtr), s.transform(Xva)

def objective(trial):
    width = trial.suggest_int("width", 32, 512, log=True)
    depth = trial.suggest_int("depth", 1, 3)
    lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    l2 = trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True)
    batch = trial.suggest_categorical("batch_size", [32, 64, 128])
    clf = MLPClassifier(hidden_layer_sizes=(width,) * depth, activation="relu", solver="adam",
                        learning_rate_init=lr, alpha=l2, batch_size=batch, max_iter=30,
                        random_state=trial.number, n_iter_no_change=1000, tol=0)
    clf.fit(Xtr, ytr)
    return clf.score(Xva, yva)

start = time.time()
study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
study.optimize(objective, n_trials=32, n_jobs=int(sys.argv[1]) if len(sys.argv) > 1 else 1)
print(f"optuna+sklearn seconds={time.time() - start:.2f} best={study.best_value:.4f}")
