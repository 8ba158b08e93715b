"""Client for salus-tune's external worker protocol (versions 1 to 3).

Standard library only; `salus_worker.torch` adds in-process swap for
PyTorch. salus-tune starts your script once per trial with
SALUS_TUNE_SOCKET set; the script connects, learns its parameters, and runs
its training loop through `Trial.iterations`, which blocks before each
iteration until salus-tune lets it run (so many scripts share one GPU
safely), and ends the process cleanly when the trial is pruned.

    import salus_worker

    trial = salus_worker.connect()
    lr = trial.params["lr"]
    model, opt = build(lr)
    trial.track(model, opt)            # in-process swap, measured memory
    for epoch in trial.iterations(100):
        loss = train_one_epoch(model, opt)
        trial.report(epoch + 1, loss)
    trial.done(loss)

A script that tracks nothing is swapped out through a checkpoint instead:
it registers `trial.on_checkpoint(save)` and resumes from
`trial.load_checkpoint(load)`.

In a PBT study (`[pbt]`), a member that takes another's state restarts
from the other's checkpoint with new `params`, unless the script registers
`trial.on_exploit(load)`, which takes it in process. See the protocol
table in salus-tune's docs (docs/external-workers.md).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import sys
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Union

VERSION = 3

__all__ = ["Trial", "connect", "run_objective", "serve", "VERSION", "is_out_of_memory"]


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` says the device ran out of memory: PyTorch's
    `OutOfMemoryError` (CUDA's or the caching allocator's cap), or XLA's
    `RESOURCE_EXHAUSTED`."""
    name = type(error).__name__
    text = str(error)
    return name == "OutOfMemoryError" or "CUDA out of memory" in text or "RESOURCE_EXHAUSTED" in text


_MIB = re.compile(r"Tried to allocate ([0-9.]+) ([KMGT]i?B)")
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def _requested_bytes(text: str) -> int:
    """The allocation an out-of-memory message names ("Tried to allocate
    20.00 MiB"), or 0."""
    m = _MIB.search(text)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else 0


def torch_cuda_memory(torch: Any) -> Dict[str, int]:
    """PyTorch's caching allocator's counts on the current CUDA device:
    `persistent` allocated now, `peak` since the last call, `cached`
    reserved beyond what is allocated."""
    allocated = torch.cuda.memory_allocated()
    memory = {
        "persistent": allocated,
        "peak": torch.cuda.max_memory_allocated(),
        "cached": max(0, torch.cuda.memory_reserved() - allocated),
    }
    torch.cuda.reset_peak_memory_stats()
    return memory


def _framework_memory(device: str) -> Optional[Dict[str, int]]:
    """What the framework already imported by the script says about its
    device memory, or None (a CPU, or no framework)."""
    torch = sys.modules.get("torch")
    if torch is not None and device == "cuda" and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch_cuda_memory(torch)
    jax = sys.modules.get("jax")
    if jax is not None and device == "cuda":
        try:
            stats = jax.devices()[0].memory_stats() or {}
        except Exception:  # a CPU-only JAX has no stats
            return None
        if "bytes_in_use" in stats:
            in_use = int(stats["bytes_in_use"])
            return {
                "persistent": in_use,
                "peak": int(stats.get("peak_bytes_in_use", in_use)),
                "cached": max(0, int(stats.get("bytes_reserved", in_use)) - in_use),
            }
    return None


def _release_cache(device: str) -> int:
    """Empties PyTorch's CUDA cache; the bytes it gave back."""
    torch = sys.modules.get("torch")
    if torch is None or device != "cuda" or not torch.cuda.is_available():
        return 0
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return max(0, before - torch.cuda.memory_reserved())


class Trial:
    """One trial, as salus-tune hands it to this process."""

    number: int
    params: Dict[str, Any]
    report_every: int
    checkpoint_path: Optional[str]
    resume_from: Optional[str]
    device: str
    memory_limit: Optional[int]

    def __init__(self, socket_path: Optional[str] = None) -> None:
        path = socket_path or os.environ.get("SALUS_TUNE_SOCKET")
        if not path:
            raise RuntimeError("SALUS_TUNE_SOCKET is not set: run this script through salus-tune")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._rfile = self._sock.makefile("r", encoding="utf-8", newline="\n")
        self._tracker: Any = None
        self._send({"type": "hello", "version": VERSION})
        self._start(self._recv())
        _install_oom_hook(self)

    def _start(self, start: Dict[str, Any]) -> None:
        if start.get("type") != "start":
            raise RuntimeError(f"expected start, got {start!r}")
        self.version = int(start.get("version", 1))
        self.number = start["trial"]
        self.params = start["params"]
        self.report_every = start.get("report_every", 1)
        self.checkpoint_path = start.get("checkpoint_path")
        self.resume_from = start.get("resume_from")
        self.device = start.get("device") or os.environ.get("SALUS_TUNE_DEVICE", "cpu")
        self.memory_limit = start.get("memory_limit")
        self._save: Optional[Callable[[str], None]] = None
        self._on_exploit: Optional[Callable[[str, Dict[str, Any]], None]] = None
        self._position = 0
        self._iterating = False
        self._cap_memory()

    def _cap_memory(self) -> None:
        """Makes the trial's grant a hard cap on PyTorch's allocator, so
        that it runs out of memory alone instead of its neighbours."""
        torch = sys.modules.get("torch")
        if not self.memory_limit or torch is None or self.device != "cuda" or not torch.cuda.is_available():
            return
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, self.memory_limit / total))

    # -- wire -----------------------------------------------------------
    def _send(self, message: Dict[str, Any]) -> None:
        data = (json.dumps(message, allow_nan=False) + "\n").encode("utf-8")
        self._sock.sendall(data)

    def _recv(self) -> Dict[str, Any]:
        line = self._rfile.readline()
        if not line:
            # salus-tune went away: nothing left to do.
            self._exit(0)
        return json.loads(line)

    def _exit(self, code: int) -> None:
        try:
            self._sock.close()
        finally:
            sys.exit(code)

    @staticmethod
    def _number(value: float) -> Any:
        value = float(value)
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return value

    # -- memory and swap ---------------------------------------------------
    def track(self, *objects: Any) -> "Trial":
        """Tracks this trial's state (PyTorch modules, optimizers and
        tensors): salus-tune then measures its memory, and swaps it to host
        memory and back inside this process instead of a checkpoint and a
        restart. Call once the objects exist, before the first iteration."""
        from salus_worker.torch import Tracker

        self._tracker = Tracker(objects, self.device)
        self._cap_memory()  # torch may not have been imported at the start
        return self

    def memory(self) -> Optional[Dict[str, int]]:
        """Device memory now, in bytes (`persistent`, `peak` since the last
        call, `cached`), as reported with each `ready`; None when nothing
        can be measured."""
        if self._tracker is not None:
            return self._tracker.memory()
        return _framework_memory(self.device)

    def _ready(self) -> None:
        message: Dict[str, Any] = {"type": "ready"}
        if self._iterating:
            # Where this trial is: a resumed script goes on from there.
            message["iteration"] = self._position
        if self.version >= 2:
            memory = self.memory()
            if memory is not None:
                message["memory"] = memory
            if self._tracker is not None:
                message["swap"] = True
        self._send(message)

    def _out_of_memory(self, error: BaseException) -> None:
        """Tells salus-tune the device ran out of memory, with what this
        trial seems to need: what it held at its peak plus what it asked
        for."""
        held = 0
        try:
            memory = self.memory()
            if memory:
                held = max(memory.get("peak", 0), memory["persistent"])
        except Exception:
            pass
        needed = held + _requested_bytes(str(error))
        try:
            if self.version >= 2:
                self._send({"type": "oom", "message": str(error)[:500], "needed": needed})
            else:
                self._send({"type": "error", "message": f"out of memory: {error}"[:500]})
        except OSError:
            pass

    # -- checkpoints -------------------------------------------------------
    def on_checkpoint(self, save: Callable[[str], None]) -> None:
        """`save(path)` writes the training state to `path` when salus-tune
        swaps this trial out through a checkpoint; the process then exits,
        and a later start has `resume_from` set to that path."""
        self._save = save

    def load_checkpoint(self, load: Optional[Callable[[str], Any]] = None) -> Any:
        """The state saved at the last checkpoint, when resuming; else None.
        `load(path)` reads it (`torch.load`, say); by default, pickle."""
        if not (self.resume_from and os.path.exists(self.resume_from)):
            return None
        if load is not None:
            return load(self.resume_from)
        with open(self.resume_from, "rb") as f:
            return pickle.load(f)

    def on_exploit(self, load: Callable[[str, Dict[str, Any]], None]) -> None:
        """PBT: `load(path, params)` makes this trial continue from another
        member's checkpoint at `path` (as its `on_checkpoint` saved it)
        with the new `params`, in process: load the model and optimizer
        state, and apply the params (set the optimizer's learning rate,
        say). `trial.params` and the iteration `trial.iterations` yields
        next follow. Without it, the process exits and is started again
        with `resume_from` and `params` set."""
        self._on_exploit = load

    def save_checkpoint(self, state: Any, path: str) -> None:
        """Pickles `state` to `path` atomically (a helper for on_checkpoint)."""
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(state, f)
        os.replace(tmp, path)

    # -- the loop ----------------------------------------------------------
    def wait_turn(self) -> None:
        """Blocks until this trial may run its next iteration. Returns on
        `go`; exits the process on `prune`; saves and exits on `checkpoint`;
        moves tracked state to the host and back on `swap_out` and
        `swap_in`."""
        self._ready()
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
            if kind == "save":
                # PBT: another member takes this one's state; it goes on.
                if self._save is None:
                    self.fail("PBT needs the trial's state: call trial.on_checkpoint(save) in the script")
                    self._exit(1)
                self._save(msg["path"])
                self._send({"type": "saved", "path": msg["path"]})
            if kind == "exploit":
                if self._on_exploit is None:
                    self._send({"type": "restart"})
                    self._exit(0)
                self._on_exploit(msg["resume_from"], msg["params"])
                self.params = msg["params"]
                self.resume_from = msg["resume_from"]
                self._position = int(msg["iteration"])
                self._send({"type": "exploited"})
            if kind == "swap_out":
                self._send({"type": "swapped_out", "bytes": self._tracker.swap_out()})
            if kind == "swap_in":
                self._send({"type": "swapped_in", "bytes": self._tracker.swap_in()})
            if kind == "release_cache":
                self._send({"type": "released", "bytes": _release_cache(self.device)})
            if kind == "pause":
                continue  # wait for the next go

    def iterations(self, total: int, start: int = 0) -> Iterator[int]:
        """Yields iteration numbers `start .. total-1`, each when salus-tune
        lets it run (after a PBT exploit in process, on from the donor's)."""
        self._position = start
        self._iterating = True
        while self._position < total:
            self.wait_turn()
            if self._position >= total:  # an exploit took it to the end
                break
            i = self._position
            self._position += 1
            yield i

    def report(self, step: int, value: float, **metrics: float) -> None:
        """An intermediate value; steps must strictly increase. Keyword
        arguments are auxiliary curves at the same step (say
        `train_loss=0.3`): stored in the `salus_metrics` table, their latest
        values as user attributes."""
        message: Dict[str, Any] = {"type": "report", "step": int(step), "value": self._number(value)}
        if metrics:
            message["metrics"] = {str(k): self._number(v) for k, v in metrics.items()}
        self._send(message)

    def set_user_attr(self, key: str, value: Any) -> None:
        """A user attribute of this trial (any JSON value), as Optuna's
        `trial.set_user_attr`; it reaches the database with the next report
        or with `done`."""
        json.dumps(value, allow_nan=False)  # fails here, not in salus-tune
        self._send({"type": "attr", "key": str(key), "value": value})

    def heartbeat(self) -> None:
        """Keeps a long iteration from hitting salus-tune's heartbeat timeout."""
        self._send({"type": "heartbeat"})

    def done(self, value: Union[float, Sequence[float]], more: bool = False) -> None:
        """The trial's final value: a number, or for a study of several
        objectives (`metric = ["a", "b"]`) a list of them, one per metric in
        that order. The process should exit after this, unless `more`:
        then call `next_trial()` to take another trial."""
        if isinstance(value, (list, tuple)):
            sent: Any = [self._number(v) for v in value]
        else:
            sent = self._number(value)
        self._send({"type": "done", "value": sent, "more": bool(more)})
        if not more:
            self._sock.close()

    def next_trial(self) -> None:
        """After `done(value, more=True)`: waits for the next trial and
        becomes it (new number and params). Exits when salus-tune is done.
        The last trial's cached device memory is given back first, so the
        next one is measured alone."""
        self._tracker = None
        _release_cache(self.device)
        self._start(self._recv())

    def fail(self, message: str) -> None:
        """Marks the trial FAIL with `message`."""
        self._send({"type": "error", "message": str(message)})
        self._sock.close()


def _install_oom_hook(trial: Trial) -> None:
    """An out-of-memory error that ends the script is reported as such, so
    that salus-tune requeues the trial with a larger grant instead of
    failing it; other errors end the trial as before."""
    previous = sys.excepthook

    def hook(kind: type, error: BaseException, tb: Any) -> None:
        if is_out_of_memory(error):
            trial._out_of_memory(error)
        previous(kind, error, tb)

    sys.excepthook = hook


def connect(socket_path: Optional[str] = None) -> Trial:
    """The trial this process runs."""
    return Trial(socket_path)


def run_objective(objective: Callable[[Dict[str, Any]], float]) -> None:
    """Runs a plain `objective(params) -> float` as a one-iteration trial."""
    trial = connect()
    trial.wait_turn()
    value = objective(trial.params)
    trial.report(1, value)
    trial.done(value)


def serve(objective: Callable[[Dict[str, Any]], float]) -> None:
    """Like `run_objective`, but this process stays and serves trial after
    trial, so a short objective does not pay a process start per trial."""

    def one(trial: Trial) -> float:
        trial.wait_turn()
        value = objective(trial.params)
        trial.report(1, value)
        return value

    serve_trials(one)


def serve_trials(run: Callable[[Trial], Union[float, Sequence[float]]]) -> None:
    """Runs `run(trial)`, a whole trial (its `trial.iterations` loop and
    reports), for trial after trial in this one process: the value it
    returns is the trial's final value. Imports, the CUDA context and the
    framework's warm-up (cuDNN's kernels, say) are paid once per process
    instead of once per trial. `run` must build everything the trial owns
    (model, optimizer, `trial.track(...)`, `trial.on_checkpoint(...)`)
    afresh each call."""
    trial = connect()
    while True:
        value = run(trial)
        trial.done(value, more=True)
        trial.next_trial()
