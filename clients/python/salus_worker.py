"""Client for salus-tune's external worker protocol, version 1.

Standard library only. salus-tune starts your script once per trial with
SALUS_TUNE_SOCKET set; the script connects, learns its parameters, and runs
its training loop through `Trial.iterations`, which blocks before each
iteration until salus-tune lets it run (so many scripts share one GPU
safely), and ends the process cleanly when the trial is pruned.

    import salus_worker

    trial = salus_worker.connect()
    lr = trial.params["lr"]
    state = trial.load_checkpoint() or init_state()          # resume
    trial.on_checkpoint(lambda path: save(state, path))      # swap-out
    for epoch in trial.iterations(100, start=state["epoch"]):
        loss = train_one_epoch(state, lr)
        state["epoch"] = epoch + 1
        trial.report(epoch + 1, loss)
    trial.done(loss)

See the protocol table in salus-tune's docs, docs/external-workers.md.
"""

import json
import os
import pickle
import socket
import sys

VERSION = 1

__all__ = ["Trial", "connect", "run_objective", "serve", "VERSION"]


class Trial:
    """One trial, as salus-tune hands it to this process."""

    def __init__(self, socket_path=None):
        path = socket_path or os.environ.get("SALUS_TUNE_SOCKET")
        if not path:
            raise RuntimeError("SALUS_TUNE_SOCKET is not set: run this script through salus-tune")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._rfile = self._sock.makefile("r", encoding="utf-8", newline="\n")
        self._send({"type": "hello", "version": VERSION})
        self._start(self._recv())

    def _start(self, start):
        if start.get("type") != "start":
            raise RuntimeError(f"expected start, got {start!r}")
        self.number = start["trial"]
        self.params = start["params"]
        self.report_every = start.get("report_every", 1)
        self.checkpoint_path = start.get("checkpoint_path")
        self.resume_from = start.get("resume_from")
        self._save = None

    # -- wire -----------------------------------------------------------
    def _send(self, message):
        data = (json.dumps(message, allow_nan=False) + "\n").encode("utf-8")
        self._sock.sendall(data)

    def _recv(self):
        line = self._rfile.readline()
        if not line:
            # salus-tune went away: nothing left to do.
            self._exit(0)
        return json.loads(line)

    def _exit(self, code):
        try:
            self._sock.close()
        finally:
            sys.exit(code)

    @staticmethod
    def _number(value):
        value = float(value)
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return value

    # -- the API ---------------------------------------------------------
    def on_checkpoint(self, save):
        """`save(path)` writes the training state to `path` when salus-tune
        swaps this trial out; the process then exits, and a later start has
        `resume_from` set to that path."""
        self._save = save

    def load_checkpoint(self):
        """The state pickled by `save_checkpoint`, when resuming; else None."""
        if self.resume_from and os.path.exists(self.resume_from):
            with open(self.resume_from, "rb") as f:
                return pickle.load(f)
        return None

    def save_checkpoint(self, state, path):
        """Pickles `state` to `path` atomically (a helper for on_checkpoint)."""
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
        os.replace(tmp, path)

    def wait_turn(self):
        """Blocks until this trial may run its next iteration. Returns on
        `go`; exits the process on `prune`; saves and exits on `checkpoint`."""
        self._send({"type": "ready"})
        while True:
            msg = self._recv()
            kind = msg.get("type")
            if kind == "go":
                return
            if kind == "prune":
                self._exit(0)
            if kind == "checkpoint":
                if self._save is None:
                    raise RuntimeError("salus-tune asked for a checkpoint but on_checkpoint was not called")
                self._save(msg["path"])
                self._send({"type": "checkpointed", "path": msg["path"]})
                self._exit(0)
            if kind == "pause":
                continue  # wait for the next go

    def iterations(self, total, start=0):
        """Yields iteration numbers `start .. total-1`, each when salus-tune
        lets it run."""
        for i in range(start, total):
            self.wait_turn()
            yield i

    def report(self, step, value, **metrics):
        """An intermediate value; steps must strictly increase. Keyword
        arguments are auxiliary curves at the same step (say
        `train_loss=0.3`): stored in the `salus_metrics` table, their latest
        values as user attributes."""
        message = {"type": "report", "step": int(step), "value": self._number(value)}
        if metrics:
            message["metrics"] = {str(k): self._number(v) for k, v in metrics.items()}
        self._send(message)

    def set_user_attr(self, key, value):
        """A user attribute of this trial (any JSON value), as Optuna's
        `trial.set_user_attr`; it reaches the database with the next report
        or with `done`."""
        json.dumps(value, allow_nan=False)  # fails here, not in salus-tune
        self._send({"type": "attr", "key": str(key), "value": value})

    def heartbeat(self):
        """Keeps a long iteration from hitting salus-tune's heartbeat timeout."""
        self._send({"type": "heartbeat"})

    def done(self, value, more=False):
        """The trial's final value. The process should exit after this,
        unless `more`: then call `next_trial()` to take another trial."""
        self._send({"type": "done", "value": self._number(value), "more": bool(more)})
        if not more:
            self._sock.close()

    def next_trial(self):
        """After `done(value, more=True)`: waits for the next trial and
        becomes it (new number and params). Exits when salus-tune is done."""
        self._start(self._recv())

    def fail(self, message):
        """Marks the trial FAIL with `message`."""
        self._send({"type": "error", "message": str(message)})
        self._sock.close()


def connect(socket_path=None):
    """The trial this process runs."""
    return Trial(socket_path)


def run_objective(objective):
    """Runs a plain `objective(params) -> float` as a one-iteration trial."""
    trial = connect()
    trial.wait_turn()
    value = objective(trial.params)
    trial.report(1, value)
    trial.done(value)


def serve(objective):
    """Like `run_objective`, but this process stays and serves trial after
    trial, so a short objective does not pay a process start per trial."""
    trial = connect()
    while True:
        trial.wait_turn()
        value = objective(trial.params)
        trial.report(1, value)
        trial.done(value, more=True)
        trial.next_trial()
