"""A plain Python objective tuned by salus-tune (see studies/external_objective.toml):
the Rosenbrock function of two parameters, one iteration per trial."""

import salus_worker


def rosenbrock(params):
    x, y = params["x"], params["y"]
    return (1 - x) ** 2 + 100 * (y - x * x) ** 2


# serve: one process takes trial after trial (run_objective would start a
# process per trial).
salus_worker.serve(rosenbrock)
