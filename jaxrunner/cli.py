"""The `jaxrunner` command line: `sample`, `train`, `envs` and `bench`.

    jaxrunner sample --env CartPole-v1 --num-envs 1024 --timesteps 1000000
    jaxrunner sample --env CartPole-v1 --num-envs 256 --runners 2 --timesteps 1000000
    jaxrunner sample --env TicTacToe-v0 --num-envs 256 --timesteps 100000
    jaxrunner train --env CartPole-v1 --seeds 8 --iterations 150 --plot returns.png
    jaxrunner envs                                # full ids; --json for a JSON list
    jaxrunner bench --num-envs 1024 4096          # writes throughput.json and .png

Bad arguments print one line and exit with code 2 (never a traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class UsageError(Exception):
    """A bad argument found after parsing (reported in one line, exit code 2)."""


def _int_at_least(minimum: int, what: str):
    """An argparse type: an integer (underscores allowed) that is at least `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonnegative_int = _int_at_least(0, "an integer >= 0")


def _float_in(low: float, high: float, what: str, *, open_low: bool = False):
    """An argparse type: a finite float in `[low, high]` (`(low, high]` with `open_low`)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or not (low < value if open_low else low <= value) or not (
                value <= high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    return parse


_positive_float = _float_in(0.0, 1e30, "a positive number", open_low=True)
_nonnegative_float = _float_in(0.0, 1e30, "a number >= 0")
_unit_float = _float_in(0.0, 1.0, "a number in [0, 1]")
_finite_float = _float_in(-1e30, 1e30, "a finite number")


def _hiddens(text: str) -> list[int]:
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer widths like 64,64, got {text!r}") from None
    if not widths or any(w < 1 for w in widths):
        raise argparse.ArgumentTypeError(f"expected positive layer widths, got {text!r}")
    return widths


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends each option with its default (none for flags and unset options)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (default is not None and default is not False and default != argparse.SUPPRESS
                and "(default" not in text and action.option_strings):
            text += " (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="jaxrunner",
                             description="Compiled RLlib-style env runners on JAX.")
    sub = parser.add_subparsers(dest="command", parser_class=_ArgumentParser)

    sample = sub.add_parser(
        "sample", formatter_class=_DefaultsFormatter,
        help="sample an env with the default MLP policy",
        description="Sample an env with the default MLP policy (a multi-agent env such as "
                    "TicTacToe-v0 or MultiAgentCartPole-v1 with one module shared by all "
                    "agents) and print RLlib's metrics.")
    sample.add_argument("--env", default="CartPole-v1",
                        help="gymnax id, registered name, multi-agent name or "
                             "gymnasium:<id> (see `jaxrunner envs`)")
    sample.add_argument("--num-envs", type=_positive_int, default=1024,
                        help="sub-envs per runner (num_envs_per_env_runner)")
    size = sample.add_mutually_exclusive_group()
    size.add_argument("--timesteps", type=_positive_int,
                      help="env steps to sample in all (default: one fragment per runner)")
    size.add_argument("--episodes", type=_positive_int, help="episodes to sample in all")
    sample.add_argument("--fragment", type=_positive_int, default=200,
                        help="rollout_fragment_length: vector steps per sample() call")
    sample.add_argument("--runners", type=_nonnegative_int, default=0,
                        help="remote runners on Ray, each with --num-envs sub-envs "
                             "(0: sample in this process)")
    sample.add_argument("--seed", type=int, default=0, help="config.debugging(seed=...)")
    sample.add_argument("--hiddens", type=_hiddens, default="64,64",
                        help="MLP layer widths, e.g. 64,64")
    sample.add_argument("--random-actions", action="store_true",
                        help="sample the action space instead of the module")
    sample.add_argument("--no-explore", action="store_true", help="take greedy actions")
    sample.add_argument("--json", action="store_true",
                        help="print the final metrics as JSON (no progress bar)")
    _add_compile_cache_option(sample)
    sample.add_argument("--logdir", metavar="DIR", default=None,
                        help="write RLlib's metrics after every sample() call to DIR as "
                             "TensorBoard event files and metrics.jsonl (x axis: lifetime "
                             "env steps); the printed metrics are then the last call's")

    from jaxrunner.learners.ppo import PPOConfig

    ppo = PPOConfig()  # the hyperparameters' defaults are the reference PPO's
    train = sub.add_parser(
        "train", formatter_class=_DefaultsFormatter,
        help="train the reference PPO on several seeds at once, in one compiled program",
        description="Trains the reference PPO (PPOLearner.fused_train) on --seeds seeds at "
                    "once: each seed's sampler rollouts and updates run inside one jax.jit, "
                    "vmapped over the seeds, with no host round trip per iteration. Prints "
                    "each seed's episode_return_mean (RLlib's mean over the last 100 "
                    "episodes) at the end; --plot draws the curves, --json prints them.")
    train.add_argument("--env", default="CartPole-v1",
                       help="a single-agent JAX env id (`jaxrunner envs` lists them)")
    train.add_argument("--seeds", type=_positive_int, default=4,
                       help="seeds trained at once: --seed, --seed + 1, ...")
    train.add_argument("--iterations", type=_positive_int, default=150,
                       help="PPO iterations per seed (one rollout and one update each)")
    train.add_argument("--target-return", type=_finite_float, default=None, metavar="R",
                       help="stop each seed after the first iteration whose "
                            "episode_return_mean reaches R (at most --iterations)")
    train.add_argument("--num-envs", type=_positive_int, default=16, help="sub-envs per seed")
    train.add_argument("--fragment", type=_positive_int, default=64,
                       help="steps per sub-env per iteration (rollout_fragment_length)")
    train.add_argument("--seed", type=_nonnegative_int, default=0, help="the first seed")
    train.add_argument("--hiddens", type=_hiddens, default="64,64",
                       help="MLP layer widths (policy and value networks)")
    train.add_argument("--activation", choices=("tanh", "relu"), default="tanh",
                       help="the MLPs' activation")
    train.add_argument("--lr", type=_positive_float, default=ppo.learning_rate,
                       help="Adam's step size")
    train.add_argument("--gamma", type=_unit_float, default=ppo.gamma, help="discount")
    train.add_argument("--gae-lambda", type=_unit_float, default=ppo.gae_lambda,
                       help="GAE's lambda")
    train.add_argument("--epochs", type=_positive_int, default=ppo.num_epochs,
                       help="passes over each iteration's batch")
    train.add_argument("--minibatches", type=_positive_int, default=ppo.num_minibatches,
                       help="minibatches per epoch")
    train.add_argument("--ent-coef", type=_nonnegative_float, default=ppo.ent_coef,
                       help="entropy bonus coefficient")
    train.add_argument("--reward-scale", type=_positive_float, default=ppo.reward_scale,
                       help="rewards are multiplied by this before GAE (0.1 for Pendulum)")
    train.add_argument("--json", action="store_true",
                       help="print the summary and the per-iteration curves as JSON")
    _add_compile_cache_option(train)
    train.add_argument("--plot", metavar="PNG", default=None,
                       help="write the return curves of every seed to this PNG")

    envs = sub.add_parser("envs", formatter_class=_DefaultsFormatter,
                          help="list every env id jaxrunner can run, with its spaces")
    envs.add_argument("--json", action="store_true",
                      help="print a JSON list of {id, source, kind, observation_space, "
                           "action_space}")

    bench = sub.add_parser("bench", formatter_class=_DefaultsFormatter,
                           help="throughput vs a bare lax.scan; writes JSON")
    bench.add_argument("--env", default="CartPole-v1", help="gymnax id")
    bench.add_argument("--num-envs", type=_positive_int, nargs="+", default=[1024, 4096],
                       help="sub-env counts to measure (default: 1024 4096)")
    bench.add_argument("--num-steps", type=_positive_int, default=128,
                       help="vector steps per sample() call")
    bench.add_argument("--rounds", type=_positive_int, default=10,
                       help="alternating measurement rounds per num_envs")
    bench.add_argument("--random-actions", action="store_true",
                       help="sample the action space instead of the MLP policy")
    bench.add_argument("--output", default="throughput.json", help="JSON results file")
    bench.add_argument("--plot", default=None,
                       help="PNG plot of env steps/s (default: --output with .png)")
    return parser


def _metrics_table(metrics: dict[str, Any], title: str = "metrics (RLlib keys)"):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("key")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        if isinstance(value, dict):
            for sub_key, sub_value in value.items():
                table.add_row(f"{key}/{sub_key}", _fmt(sub_value))
        else:
            table.add_row(key, _fmt(value))
    return table


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _as_list(batches: Any) -> list:
    return batches if isinstance(batches, list) else [batches]


SHARED_MODULE_ID = "shared_policy"


def _share_one_module(agent_id: str, episode: Any) -> str:
    return SHARED_MODULE_ID


def _make_config(args: argparse.Namespace):
    """The run's `RunnerConfig`; a multi-agent env gets one module shared by all agents."""
    import jaxrunner
    from jaxrunner.envs.kind import MULTI_AGENT
    from jaxrunner.runners.selection import env_kind

    config = (jaxrunner.RunnerConfig()
              .environment(args.env)
              .env_runners(num_envs_per_env_runner=args.num_envs,
                           rollout_fragment_length=args.fragment,
                           num_env_runners=args.runners,
                           explore=not args.no_explore,
                           # The command line wants every step it asked for: no runner's
                           # batch is dropped for being slow (the first call compiles).
                           sample_timeout_s=None)
              .rl_module(model_config={"fcnet_hiddens": args.hiddens})
              .debugging(seed=args.seed))
    if env_kind(config) == MULTI_AGENT:
        config = config.multi_agent(policies={SHARED_MODULE_ID},
                                    policy_mapping_fn=_share_one_module)
    return config


def _add_compile_cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile-cache", metavar="DIR", nargs="?", const="", default=None,
                        help="keep compiled programs in DIR (~/.cache/jaxrunner/xla if "
                             "given without DIR) so the next run of the same sizes starts "
                             "without compiling")


def _enable_compile_cache(args: argparse.Namespace) -> None:
    """`--compile-cache`: JAX's persistent compilation cache (`enable_compilation_cache`);
    a directory it cannot use is a usage error."""
    if args.compile_cache is None:
        return
    import jaxrunner

    try:
        jaxrunner.enable_compilation_cache(args.compile_cache or None)
    except (ValueError, OSError) as error:
        raise UsageError(f"--compile-cache: {error}") from error


def _make_sampler(args: argparse.Namespace):
    """The runner class for the env (`runner_class_for`), or an `EnvRunnerGroup` with
    `--runners` remote runners."""
    import jaxrunner

    _enable_compile_cache(args)
    config = _make_config(args)
    if not args.runners:
        return jaxrunner.runner_class_for(config)(config=config)
    import logging

    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, logging_level=logging.ERROR)
    return jaxrunner.EnvRunnerGroup(config=config)


def _cmd_sample(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    log = None
    if args.logdir is not None:
        from jaxrunner.metrics.experiment_log import ExperimentLog

        if os.path.exists(args.logdir) and not os.path.isdir(args.logdir):
            raise UsageError(f"--logdir {args.logdir!r} is a file; give a directory")
        try:
            log = ExperimentLog(args.logdir)
        except OSError as error:
            raise UsageError(f"cannot write --logdir {args.logdir!r}: {error}") from error
    try:
        runner = _make_sampler(args)
    except (ValueError, TypeError) as error:
        raise UsageError(str(error).splitlines()[0]) from error
    parallel = max(1, args.runners)  # runners sampling at once; sizes below are per runner
    console = Console(stderr=True)
    total = args.episodes if args.episodes else (
        args.timesteps or args.num_envs * args.fragment * parallel)
    unit = "episodes" if args.episodes else "env steps"
    done, steps, start = 0, 0, time.perf_counter()
    first_call_s, first_call_steps = None, 0
    try:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                      TextColumn("{task.completed:,}/{task.total:,} " + unit),
                      TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                      console=console, disable=args.json) as progress:
            task = progress.add_task(f"sampling {args.env}", total=total, rate="")
            while done < total:
                call_start = time.perf_counter()
                if args.episodes:
                    per_runner = -(-min(args.num_envs * parallel, total - done) // parallel)
                    batches = _as_list(runner.sample(num_episodes=per_runner,
                                                     random_actions=args.random_actions))
                    done += sum(len(batch) for batch in batches)
                    steps += sum(batch.num_vector_steps * args.num_envs for batch in batches)
                else:
                    per_runner = -(-min(args.num_envs * args.fragment * parallel,
                                        total - done) // parallel)
                    batches = _as_list(runner.sample(num_timesteps=per_runner,
                                                     random_actions=args.random_actions))
                    done += sum(batch.env_steps for batch in batches)
                    steps += sum(batch.env_steps for batch in batches)
                if first_call_s is None:
                    first_call_s, first_call_steps = time.perf_counter() - call_start, steps
                if log is not None:
                    metrics = runner.get_metrics()
                    log.log(metrics, step=metrics["num_env_steps_sampled_lifetime"])
                elapsed = time.perf_counter() - start
                progress.update(task, completed=min(done, total),
                                rate=f"{steps / max(elapsed, 1e-9):,.0f} steps/s")
        elapsed = time.perf_counter() - start
        if log is None:
            metrics = runner.get_metrics()
    finally:
        runner.stop()
        if log is not None:
            log.close()
        if args.runners:
            import ray

            ray.shutdown()
    summary = {"env": args.env, "num_envs": args.num_envs, "runners": args.runners,
               "env_steps": steps, "wall_s": elapsed,
               "first_call_s (incl. compile)": first_call_s,
               "env_steps_per_s": steps / max(elapsed, 1e-9),
               "env_steps_per_s_after_compile": (
                   (steps - first_call_steps) / max(elapsed - first_call_s, 1e-9)
                   if steps > first_call_steps and not args.episodes else None)}
    if args.json:
        print(json.dumps({"summary": summary, "metrics": metrics}, indent=1, default=str))
    else:
        out = Console()
        out.print(_metrics_table({k: v for k, v in summary.items() if v is not None},
                                 title="run summary"))
        out.print(_metrics_table(metrics))
    return 0


def _finite_or_none(values: Any) -> list:
    """A float array as a JSON-ready list: NaN (no episode finished yet) as None."""
    import numpy as np

    array = np.asarray(values, dtype=float)
    return [None if not np.isfinite(v) else float(v) for v in array.reshape(-1)]


def plot_returns(curves: dict[str, Any], path: str, title: str) -> None:
    """`episode_return_mean` against env steps sampled, one line per seed, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for seed, steps, returns in zip(curves["seeds"], curves["env_steps"],
                                    curves["episode_return_mean"]):
        ax.plot(steps, [float("nan") if r is None else r for r in returns],
                label=f"seed {seed}", linewidth=1.2)
    ax.set_xlabel("env steps sampled (per seed)")
    ax.set_ylabel("episode_return_mean (last 100 episodes)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cmd_train(args: argparse.Namespace) -> int:
    import numpy as np
    from rich.console import Console

    import jaxrunner
    from jaxrunner.learners import PPOConfig, PPOLearner

    if args.plot is not None:
        _check_plot_path(args.plot)
    _enable_compile_cache(args)
    try:
        config = (jaxrunner.RunnerConfig().environment(args.env)
                  .env_runners(num_envs_per_env_runner=args.num_envs,
                               rollout_fragment_length=args.fragment)
                  .rl_module(model_config={"fcnet_hiddens": args.hiddens,
                                           "fcnet_activation": args.activation})
                  .debugging(seed=args.seed))
        ppo = PPOConfig(learning_rate=args.lr, gamma=args.gamma, gae_lambda=args.gae_lambda,
                        ent_coef=args.ent_coef, num_epochs=args.epochs,
                        num_minibatches=args.minibatches, reward_scale=args.reward_scale,
                        seed=args.seed)
        sampler = jaxrunner.make_sampler(config)
        learner = PPOLearner.from_sampler(sampler, ppo)
        learner.make_train(sampler, args.iterations)  # checks the sizes; compiles nothing
    except (ValueError, TypeError) as error:
        raise UsageError(str(error).splitlines()[0]) from error
    console = Console(stderr=True)
    if not args.json:
        console.print(f"training {args.seeds} seed(s) of PPO on {args.env} for "
                      f"{args.iterations} iterations in one compiled program ...")
    run = learner.fused_train(sampler, args.iterations, seeds=args.seeds,
                              target_return=args.target_return)
    metrics = run["metrics"]
    ran = run["iterations_run"]  # a seed that reached --target-return stopped there
    env_steps = [np.asarray(row)[:n] for row, n in
                 zip(metrics["num_env_steps_sampled_lifetime"], ran)]  # (S, ran)
    returns = [np.asarray(row, dtype=float)[:n]
               for row, n in zip(metrics["episode_return_mean"], ran)]
    episodes = np.asarray(metrics["num_episodes_lifetime"])
    total_steps = int(sum(int(row[-1]) for row in env_steps))
    summary = {"env": args.env, "seeds": len(run["seeds"]), "iterations": args.iterations,
               **({} if args.target_return is None else {
                   "target_return": args.target_return,
                   "seeds_reaching_it": sum(int(n < args.iterations or row[-1]
                                                >= args.target_return)
                                            for n, row in zip(ran, returns))}),
               "env_steps (all seeds)": total_steps,
               **({"env_steps_per_seed": int(env_steps[0][-1])} if len(set(ran)) == 1
                  else {}),
               "wall_s (incl. compile)": run["time_s"],
               "env_steps_per_s (all seeds, incl. compile)": total_steps / run["time_s"]}
    curves = {"seeds": run["seeds"],
              "env_steps": [[int(v) for v in row] for row in env_steps],
              "episode_return_mean": [_finite_or_none(row) for row in returns]}
    if args.plot is not None:
        plot_returns(curves, args.plot, f"PPO on {args.env}: {len(run['seeds'])} seeds, "
                     f"{args.num_envs} sub-envs x {args.fragment} steps per iteration")
    per_seed = []
    for i, seed in enumerate(run["seeds"]):
        finite = returns[i][np.isfinite(returns[i])]  # NaN until an episode has finished
        per_seed.append({"seed": seed, "iterations": ran[i],
                         "env_steps": int(env_steps[i][-1]),
                         "episode_return_mean": _finite_or_none(returns[i][-1:])[0],
                         "best_episode_return_mean": float(finite.max()) if finite.size
                         else None,
                         "episodes": int(episodes[i, -1])})
    if args.json:
        print(json.dumps({"summary": summary, "per_seed": per_seed, "curves": curves},
                         indent=1))
        return 0
    from rich.table import Table

    out = Console()
    out.print(_metrics_table(summary, title="run summary"))
    table = Table(title="each seed at the end (episode_return_mean: last 100 episodes)")
    for column in per_seed[0]:
        table.add_column(column, justify="right")
    for row in per_seed:
        table.add_row(*("n/a" if row[c] is None else _fmt(row[c]) for c in row))
    out.print(table)
    if args.plot is not None:
        out.print(f"wrote {args.plot}")
    return 0


def _space_text(space: Any) -> str:
    from jaxrunner.envs.spaces import to_gymnasium

    return str(to_gymnasium(space))


def _short_space(text: str) -> str:
    """`Box(low, high, shape, dtype)` as `Box(shape, dtype)`: the bounds make a table
    unreadable; `--json` keeps them."""
    if text.startswith("Box(") and text.endswith(")"):
        inner = text[4:-1]
        shape_at = inner.rfind("(")
        if shape_at > 0:
            return "Box(" + inner[shape_at:] + ")"
    return text


def _short_spaces(text: str) -> str:
    """A row's space text for the table: bounds dropped; a multi-agent env whose agents
    all have the same space shows it once."""
    parts = text.split("; ")
    if len(parts) == 1 and ": " not in text.split("(")[0]:  # a single-agent env's space
        return _short_space(text)
    spaces = [part.partition(": ")[2] for part in parts]
    if len(set(spaces)) == 1:
        return f"each agent: {_short_space(spaces[0])}"
    return "; ".join(f"{part.partition(': ')[0]}: {_short_space(space)}"
                     for part, space in zip(parts, spaces))


def env_rows() -> list[dict[str, str]]:
    """Every env id `jaxrunner sample --env` takes, with its source, kind and spaces
    (a multi-agent env's spaces per agent, `agent: space; ...`)."""
    import jaxrunner.envs.multi_agent  # noqa: F401 - registers the built-in names
    from jaxrunner.envs.context import EnvContext
    from jaxrunner.envs.kind import MULTI_AGENT, env_kind_of
    from jaxrunner.envs.registry import gymnax_env_ids, make_jax_env, registered_env_names

    rows = []
    for name, source in ([(n, "register_env") for n in registered_env_names()]
                         + [(n, "gymnax") for n in gymnax_env_ids()]):
        env, params, _ = make_jax_env(name, EnvContext())
        kind = env_kind_of(env)
        if kind == MULTI_AGENT:
            obs = "; ".join(f"{a}: {_space_text(env.observation_space(a, params))}"
                            for a in env.agents)
            act = "; ".join(f"{a}: {_space_text(env.action_space(a, params))}"
                            for a in env.agents)
        elif not callable(env.observation_space):  # a gymnasium env (stepped on the host)
            obs, act = _space_text(env.observation_space), _space_text(env.action_space)
            if hasattr(env, "close"):
                env.close()
        else:
            obs = _space_text(env.observation_space(params))
            act = _space_text(env.action_space(params))
        rows.append({"id": name, "source": source, "kind": kind,
                     "observation_space": obs, "action_space": act})
    from jaxrunner.envs.adapters import suite_env_rows

    # Env suites: ids only (making each env would load or compile it; spaces "").
    rows += [{**row, "observation_space": "", "action_space": ""}
             for row in suite_env_rows()[0]]
    return rows


def _print_missing_suites(file) -> None:
    """One line per env suite that `jaxrunner envs` could not list, with how to add it."""
    from jaxrunner.envs.adapters import suite_env_rows

    for row in suite_env_rows()[1]:
        print(f"suite {row['prefix']}/ not listed: {row['reason']}", file=file)


_ENV_COLUMNS = ("id", "source", "kind", "observation_space", "action_space")


def _cmd_envs(args: argparse.Namespace) -> int:
    rows = env_rows()
    if args.json:
        print(json.dumps(rows, indent=1))
        _print_missing_suites(sys.stderr)
        return 0
    if not sys.stdout.isatty():
        # Piped: one tab-separated line per env, nothing cut to a terminal width.
        print("\t".join(_ENV_COLUMNS))
        for row in rows:
            print("\t".join(_short_spaces(row[c]) if c.endswith("space") else row[c]
                            for c in _ENV_COLUMNS))
        _print_missing_suites(sys.stderr)
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="envs jaxrunner can run")
    # Ids are never cut; long spaces wrap inside their cells.
    table.add_column("env id", no_wrap=True, min_width=max(len(r["id"]) for r in rows))
    table.add_column("source", no_wrap=True)
    table.add_column("kind", no_wrap=True)  # single_agent / multi_agent
    table.add_column("observation space", overflow="fold")
    table.add_column("action space", overflow="fold")
    for row in rows:
        table.add_row(*(_short_spaces(row[c]) if c.endswith("space") else row[c]
                        for c in _ENV_COLUMNS))
    Console().print(table)
    _print_missing_suites(sys.stdout)
    return 0


def _check_writable(path: str, what: str) -> None:
    """A bad output path is a bad argument: say so before any work is done."""
    if os.path.isdir(path):
        raise UsageError(f"{what} {path!r} is a directory; give a file name")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"cannot write {what} {path!r}: directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"cannot write {what} {path!r}: directory {directory!r} is not writable")


def _check_plot_path(path: str) -> None:
    """A `--plot` that cannot be written (or no matplotlib to draw it) is a bad argument."""
    _check_writable(path, "--plot")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("writing the plot needs matplotlib (pip install 'jaxrunner[bench]')"
                         ) from None


def plot_throughput(results: dict[str, Any], path: str) -> None:
    """Env steps/s against num_envs (log-log), one line per sampler, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted(results["cases"], key=lambda case: case["num_envs"])
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for side in cases[0]["steps_per_s"]:
        ax.plot([c["num_envs"] for c in cases], [c["steps_per_s"][side] for c in cases],
                marker="o", label=side)
    for case in cases:
        ratio = case.get("ratio_to_bare_scan", {}).get("jaxrunner")
        if ratio is not None:
            ax.annotate(f"{ratio:.2f}x", (case["num_envs"], case["steps_per_s"]["jaxrunner"]),
                        textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([c["num_envs"] for c in cases], [str(c["num_envs"]) for c in cases])
    ax.set_xlabel("num_envs (sub-envs per runner)")
    ax.set_ylabel("env steps/s (best round)")
    ax.set_title(f"{results.get('env')}: {results.get('policy')}, "
                 f"{results.get('num_steps_per_call')} steps per call", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cmd_bench(args: argparse.Namespace) -> int:
    from jaxrunner.benchmarking import run_throughput

    plot = args.plot or os.path.splitext(args.output)[0] + ".png"
    _check_writable(args.output, "--output")
    _check_plot_path(plot)
    results: dict[str, Any] | None = None
    for num_envs in args.num_envs:  # one case at a time, reported as soon as it is measured
        try:
            case = run_throughput(env_id=args.env, num_envs_list=[num_envs],
                                  num_steps=args.num_steps,
                                  random_actions=args.random_actions, rounds=args.rounds,
                                  output=None, progress=lambda line: None)
        except (ValueError, TypeError) as error:
            raise UsageError(str(error).splitlines()[0]) from error
        for line in bench_summary_lines(case):
            print(line, flush=True)
        if results is None:
            results = case
        else:
            results["cases"].extend(case["cases"])
    with open(args.output, "w") as f:
        json.dump(results, f, indent=1)
    plot_throughput(results, plot)
    print(f"wrote {args.output} and {plot}")
    return 0


def bench_summary_lines(results: dict[str, Any]) -> list[str]:
    """One line per `num_envs`: each side's steps/s in its median round and the median of
    the per-round ratios (the figure the README uses), then each side's best round,
    labelled as such, so no best-round rate stands next to a median ratio."""
    lines = []
    for case in results["cases"]:
        median = case["median_steps_per_s"]
        best = case["steps_per_s"]
        ratio = case.get("ratio_to_bare_scan", {}).get("jaxrunner")
        sides = ", ".join(f"{side} {rate:,.0f}" for side, rate in median.items())
        text = (f"{results.get('env')} num_envs={case['num_envs']}: median round "
                f"(env steps/s): {sides}")
        if ratio is not None:
            text += f"; jaxrunner / bare_scan (median of per-round ratios): {ratio:.3f}"
        text += "; best round: " + ", ".join(f"{side} {rate:,.0f}"
                                            for side, rate in best.items())
        lines.append(text)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    commands = {"sample": _cmd_sample, "train": _cmd_train, "envs": _cmd_envs,
                "bench": _cmd_bench}
    try:
        return commands[args.command](args)
    except UsageError as error:
        print(f"jaxrunner {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `jaxrunner envs | head`: the reader left early
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
