"""Multi-objective TPE's clip exponent on continuous dimensions, seed for seed
against the default 1.25 over seeds 100-199: medians and seeds better / worse."""
import json, statistics as st

runs = {e: {x["problem"]: x for x in json.load(open(f"tpe-clip-{e}-seeds100-199.json"))}
        for e in ["1.25", "1.15", "1.0"]}
print("exponent problem trials: median at 1.25 -> median at the exponent; seeds better / worse")
for e in ["1.15", "1.0"]:
    for p in ["zdt1", "zdt2", "dtlz2", "bnh"]:
        for n in ["100", "300"]:
            a = runs["1.25"][p][f"hypervolume_{n}_per_seed"]
            v = runs[e][p][f"hypervolume_{n}_per_seed"]
            print(f"{e:4} {p:5} @{n}: {st.median(a):.4f} -> {st.median(v):.4f}; "
                  f"{sum(y > x for x, y in zip(a, v))} / {sum(y < x for x, y in zip(a, v))}")
