"""What `import jaxrunner` costs a fresh process, against what it cost with gymnax's
plotting imports and against `import gymnax` alone.

    python benchmarks/import_time.py [--rounds 5] [--output PATH]

`import gymnax` imports every gymnax env, and five of those modules import seaborn (which
brings scipy.stats and pandas) and matplotlib.pyplot at module level, only for `render`.
`jaxrunner._gymnax_import` imports gymnax with those two names bound to stand-ins that
load the real module on first use. Sides, each timed inside a fresh Python process
(interpreter start-up excluded), in rounds whose order rotates:

* `jaxrunner`: `import jaxrunner`, as shipped;
* `jaxrunner_eager_plotting`: `import seaborn, matplotlib.pyplot` then `import jaxrunner`,
  which is what `import jaxrunner` paid before the stand-ins;
* `gymnax`: `import gymnax` alone, what a bare gymnax/PureJaxRL script pays.

`ratio_to_jaxrunner` is a side's median seconds over `jaxrunner`'s (above 1: importing
jaxrunner is faster). JSON to `benchmarks/results/import_time.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

from same_process_ab import run_header  # noqa: E402

SIDES = {
    "jaxrunner": "import jaxrunner",
    "jaxrunner_eager_plotting": "import seaborn, matplotlib.pyplot\nimport jaxrunner",
    "gymnax": "import gymnax",
}

_CHILD = """
import json, time
start = time.perf_counter()
{statement}
print(json.dumps(time.perf_counter() - start))
"""


def time_import(statement: str) -> float:
    """Seconds `statement` takes in a fresh process (CPU JAX, non-interactive plots)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(statement=statement)],
                          capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{statement!r} failed in a fresh process:\n{proc.stderr[-2000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1]))


def measure(rounds: int) -> dict:
    """Every side's seconds per round (order rotated each round), medians and ratios."""
    names = list(SIDES)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    loads = []
    for round_index in range(rounds):
        loads.append(round(os.getloadavg()[0], 2))
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            seconds[name].append(time_import(SIDES[name]))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {"rounds": rounds, "load_avg_1min_per_round": loads, "seconds": seconds,
            "median_s": medians,
            "ratio_to_jaxrunner": {name: medians[name] / medians["jaxrunner"]
                                   for name in names if name != "jaxrunner"}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "import_time.json"))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    result = {**run_header("import_time"), "sides": SIDES, **measure(args.rounds)}
    for name, median in result["median_s"].items():
        print(f"{name}: median {median:.2f} s", flush=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.output}")
    return result


if __name__ == "__main__":
    main()
