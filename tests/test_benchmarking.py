"""The bare rollouts the benchmarks time jaxrunner against (`jaxrunner.benchmarking`):
what they compute, and that their timed calls run the first call's compiled program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import spaces as gx

from jaxrunner import benchmarking

pytestmark = pytest.mark.usefixtures("fast_compiles")


def test_make_bare_scan__later_calls_compile_nothing(compile_counter):
    """Pendulum's reset gives weakly typed leaves that its step makes strong: without a
    strongly typed carry the second call (the first timed one) compiled again."""
    run = benchmarking.make_bare_scan("Pendulum-v1", 4, 8, (8,), random_actions=False)
    compile_counter.reset()
    run()
    run()
    assert compile_counter.count == 0, compile_counter.messages


def test_make_policy__actions_in_the_space_with_their_logp():
    obs = jnp.ones((5, 3))
    key = jax.random.key(1)
    act = jax.jit(benchmarking.make_policy(3, gx.Discrete(4), (8,)))
    action, logp = act(obs, key)
    assert action.shape == (5,) and logp.shape == (5,) and logp.dtype == jnp.float32
    assert np.all((np.asarray(action) >= 0) & (np.asarray(action) < 4))
    assert np.all(np.asarray(logp) <= 0.0)

    act = jax.jit(benchmarking.make_policy(3, gx.Box(-0.5, 0.5, (2,)), (8,)))
    action, logp = act(obs.astype(jnp.uint8), key)  # integer observations are cast
    assert action.shape == (5, 2) and logp.shape == (5,)
    assert np.all(np.abs(np.asarray(action)) <= 0.5)

    act = jax.jit(benchmarking.make_policy(3, gx.Discrete(4), (8,), random_actions=True))
    action, logp = act(obs, key)
    assert action.shape == (5,) and np.all(np.asarray(logp) == 0.0)


def test_make_scan_rollout__matches_a_python_loop_over_the_same_functions():
    """A counter env (reward = the action, done every third step, then back to 0) with a
    policy that always takes action 1: the scan's trajectory is the plain loop's."""
    num_envs, num_steps = 3, 7

    def reset(keys):
        return jnp.zeros((keys.shape[0],)), jnp.zeros((keys.shape[0],), jnp.int32)

    def step(keys, state, action):
        state = state + 1
        done = state == 3
        state = jnp.where(done, 0, state)
        return state.astype(jnp.float32), state, action.astype(jnp.float32), done

    def act(obs, key):
        return jnp.ones(obs.shape[0], jnp.int32), jnp.zeros(obs.shape[0])

    run = benchmarking.make_scan_rollout(reset, step, act, num_envs, num_steps)
    obs, action, reward, done, logp = map(np.asarray, run())
    expected_obs, expected_done, state = [], [], 0
    for _ in range(num_steps):
        expected_obs.append(state)
        state = (state + 1) % 3
        expected_done.append(state == 0)
    assert obs.shape == (num_steps, num_envs)
    np.testing.assert_array_equal(obs, np.repeat(np.array(expected_obs, np.float32)[:, None],
                                                 num_envs, 1))
    np.testing.assert_array_equal(done, np.repeat(np.array(expected_done)[:, None], num_envs,
                                                  1))
    assert np.all(action == 1) and np.all(reward == 1.0) and np.all(logp == 0.0)
    # The next call continues from the carry: the counter goes on from step 7 (7 % 3 = 1).
    obs, *_ = map(np.asarray, run())
    assert obs[0, 0] == num_steps % 3



def test_make_bare_scan__over_seeds_each_seed_is_its_own_rollout(compile_counter):
    """`num_seeds`: one program of `S` rollouts, `[S, T, B, ...]`, each seed with its own
    keys (their trajectories differ); later calls compile nothing."""
    run = benchmarking.make_bare_scan("CartPole-v1", 4, 8, (8,), random_actions=True,
                                      num_seeds=3)
    compile_counter.reset()
    obs, action, reward, done, logp = map(np.asarray, run())
    run()
    assert compile_counter.count == 0, compile_counter.messages
    assert obs.shape == (3, 8, 4, 4) and action.shape == reward.shape == done.shape == (3, 8, 4)
    assert not np.array_equal(obs[0], obs[1]) and not np.array_equal(obs[1], obs[2])

@pytest.mark.parametrize("script, case, sides, extra", [
    ("separate_outputs.py", "Pendulum-v1:4", {"fused", "auto", "all"},
     ("auto_separates", ["obs"])),
    ("separate_resets.py", "CartPole-v1:4", {"fused", "separate"}, ("auto_separates", True)),
    ("separate_draws.py", "CartPole-v1:4", {"together", "apart"},
     ("auto_separates_draws", False)),
    ("proven_finite.py", "Breakout-MinAtar:4", {"proven", "tested", "check_off"},
     ("proven", [True])),
    ("narrow_store.py", "Breakout-MinAtar:4", {"narrow", "float_trajectory", "float"},
     ("store_dtypes", ["uint8"])),
    ("unroll_limit.py", "CartPole-v1+partial:4", {"unrolled", "jax"}, ("auto_unrolls", True)),
    ("recorded_outputs.py", "CartPole-v1:4", {"recorded", "not_recorded"},
     ("default_records", True))])
def test_same_process_ab_scripts__write_every_side_and_the_default_they_pick(
        tmp_path, script, case, sides, extra):
    """The same-process A/B scripts run a tiny case end to end: every side's ratio to the
    bare scan and what the default picks for the env."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    output = tmp_path / "ab.json"
    subprocess.run([sys.executable, os.path.join(root, "benchmarks", script), "--rounds", "1",
                    "--cases", case, "--output", str(output)], check=True, timeout=600,
                   capture_output=True)
    result = json.loads(output.read_text())
    (measured,) = result["cases"]
    assert set(measured["ratio_to_bare_scan"]) == sides
    assert all(ratio > 0 for ratio in measured["ratio_to_bare_scan"].values())
    key, value = extra
    assert measured[key] == value


def test_ppo_final_values__times_both_updates_on_the_same_trajectory(tmp_path):
    """`ppo_final_values.py` runs a tiny case end to end: the store is smaller than the
    dense rows and both updates are timed."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    output = tmp_path / "final_values.json"
    subprocess.run([sys.executable, os.path.join(root, "benchmarks", "ppo_final_values.py"),
                    "--rounds", "1", "--cases", "CartPole-v1:4:32", "--output", str(output)],
                   check=True, timeout=600, capture_output=True)
    (case,) = json.loads(output.read_text())["cases"]
    assert case["store_rows"] == 4 * 5 + 4 and case["dense_rows"] == 4 * 32
    assert set(case["timings_s"]) == {"store", "dense"}
    assert all(seconds > 0 for times in case["timings_s"].values() for seconds in times)
    assert case["ratio_to_dense"] > 0



def test_import_time__times_every_side_in_fresh_processes(tmp_path):
    """`import_time.py` with one round: each side timed once, in the JSON with its ratio."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    output = tmp_path / "import_time.json"
    subprocess.run([sys.executable, os.path.join(root, "benchmarks", "import_time.py"),
                    "--rounds", "1", "--output", str(output)],
                   check=True, timeout=600, capture_output=True)
    result = json.loads(output.read_text())
    sides = {"jaxrunner", "jaxrunner_eager_plotting", "gymnax"}
    assert set(result["seconds"]) == sides and set(result["sides"]) == sides
    assert all(len(times) == 1 and times[0] > 0 for times in result["seconds"].values())
    assert set(result["ratio_to_jaxrunner"]) == sides - {"jaxrunner"}
    assert result["commit"]

def _benchmark_scripts() -> list[str]:
    import os

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "benchmarks")
    scripts = []
    for name in sorted(os.listdir(folder)):  # the runnable ones (not the shared helpers)
        if name.endswith(".py"):
            with open(os.path.join(folder, name)) as f:
                if 'if __name__ == "__main__":' in f.read():
                    scripts.append(name)
    return scripts


@pytest.mark.parametrize("script", _benchmark_scripts())
def test_benchmark_scripts__help_prints_and_exits_cleanly(script, monkeypatch, capsys):
    """`python benchmarks/<script> --help` prints its usage (argparse formats every help
    string then: a stray `%` in one fails here) and exits 0 without running anything."""
    import os
    import runpy
    import sys

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", script)
    monkeypatch.setattr(sys, "argv", [path, "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(path, run_name="__main__")
    assert exited.value.code in (0, None)
    assert "usage" in capsys.readouterr().out


def test_compile_parts__each_piece_compiles_in_a_fresh_process_and_is_recorded(tmp_path):
    """`benchmarks/compile_parts.py` compiles the pieces it is given in fresh processes and
    records each one's trace-and-lower and compile seconds per round and its fusion
    count."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    output = tmp_path / "parts.json"
    subprocess.run([sys.executable, os.path.join(root, "benchmarks", "compile_parts.py"),
                    "--rounds", "1", "--pieces", "metric_ring", "restart_reset",
                    "--output", str(output)], check=True, timeout=600, capture_output=True)
    pieces = json.loads(output.read_text())["pieces"]
    assert set(pieces) == {"metric_ring", "restart_reset"}
    for piece in pieces.values():
        assert len(piece["compile_s"]) == 1 and piece["median_compile_s"] > 0
        assert len(piece["trace_lower_s"]) == 1 and piece["median_trace_lower_s"] > 0
        assert len(piece["compile_cpu_s"]) == 1 and piece["median_compile_cpu_s"] > 0
        assert piece["fusions"] > 0


def test_compile_parts__vmapped_over_seeds_with_llvm_ir_bytes(tmp_path):
    """`--seeds N` compiles the pieces vmapped over N seeds (more kernels than one seed's
    ring), and `--llvm-ir` records the bytes of LLVM IR XLA generated for each."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "benchmarks", "compile_parts.py")
    runs = {}
    for seeds in (0, 2):
        output = tmp_path / f"parts_{seeds}.json"
        subprocess.run([sys.executable, script, "--rounds", "1", "--pieces", "metric_ring",
                        "--seeds", str(seeds), "--llvm-ir", "--output", str(output)],
                       check=True, timeout=600, capture_output=True)
        runs[seeds] = json.loads(output.read_text())
    assert runs[2]["seeds"] == 2
    one, two = runs[0]["pieces"]["metric_ring"], runs[2]["pieces"]["metric_ring"]
    assert one["llvm_ir_bytes"] > 0 and two["llvm_ir_bytes"] > 0
    assert two["fusions"] >= one["fusions"]
    # The seeds are a leading axis of the compiled ring's flags (not ignored).
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
        import compile_parts
        text = compile_parts._lowering("metric_ring", "CartPole-v1", 2)().as_text()
    finally:
        sys.path.remove(os.path.join(root, "benchmarks"))
    assert "tensor<2x64x16xi1>" in text


def test_step_trace__times_both_sides_in_fresh_processes(tmp_path):
    """`benchmarks/step_trace.py` times a fresh runner's trace of its first program in
    fresh processes with the step's trace shared and traced twice, and records both."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    output = tmp_path / "step_trace.json"
    subprocess.run([sys.executable, os.path.join(root, "benchmarks", "step_trace.py"),
                    "--envs", "CartPole-v1", "--rounds", "1", "--num-envs", "4",
                    "--output", str(output)], check=True, timeout=600, capture_output=True)
    results = json.loads(output.read_text())
    case = results["envs"]["CartPole-v1"]
    for side in ("shared", "traced_twice"):
        run = {key: values[0] for key, values in case[side].items()
               if not key.startswith("median")}
        assert all(seconds > 0 for seconds in run.values()) and len(run) == 5
        assert run["trace_s"] == pytest.approx(run["lookback_s"] + run["chunk_trace_s"])
        assert run["trace_and_lower_s"] == pytest.approx(run["trace_s"] + run["lower_s"])
    assert case["saved_s_median"] == pytest.approx(
        case["traced_twice"]["median_trace_and_lower_s"]
        - case["shared"]["median_trace_and_lower_s"])


def test_compile_parts__rng_lowering_pieces_lower_the_fused_program_each_way(monkeypatch):
    """`fused_ppo_jax_rng` / `fused_ppo_unrolled_rng` are the fused PPO program with
    JAX's Threefry lowering (its hash a loop: more while loops) and with the unrolled
    hash; `fused_ppo` at one seed is the former, as `unroll_for_training` picks."""
    import importlib
    import os

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "benchmarks"))
    compile_parts = importlib.import_module("compile_parts")

    loops = {piece: compile_parts._lowering(piece, "CartPole-v1")().as_text().count(
        "stablehlo.while") for piece in ("fused_ppo", "fused_ppo_jax_rng",
                                         "fused_ppo_unrolled_rng")}
    assert loops["fused_ppo_jax_rng"] > loops["fused_ppo_unrolled_rng"] > 0
    assert loops["fused_ppo"] == loops["fused_ppo_jax_rng"]


def test_compile_parts__the_sampler_holds_its_chunk_and_the_chunk_its_ring(monkeypatch):
    """The pieces nest as the script's JSON reads them: `Sampler.sample` compiles to more
    kernels than its chunk alone, and the chunk to more than its metric-ring update."""
    import importlib
    import os

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "benchmarks"))
    compile_parts = importlib.import_module("compile_parts")

    measured = {piece: compile_parts.measure_piece(piece, "CartPole-v1")
                for piece in ("sampler_sample", "chunk", "metric_ring")}
    fusions = {piece: m["fusions"] for piece, m in measured.items()}
    assert fusions["sampler_sample"] > fusions["chunk"] > fusions["metric_ring"] > 0
    # The sampler's time loop is its chunk's: the same body; the ring has no time loop.
    loop = measured["chunk"]["time_loop_fusions"]
    assert 0 < loop < fusions["chunk"]
    assert measured["sampler_sample"]["time_loop_fusions"] == loop
    assert "time_loop_fusions" not in measured["metric_ring"]


def test_kernel_forms__each_form_compiles_in_a_fresh_process_with_its_llvm_ir(tmp_path):
    """`benchmarks/kernel_forms.py` compiles the forms it is given in fresh processes and
    records their compile seconds and LLVM IR bytes, with the CPU's vector extensions
    (the forms' sizes depend on them: a bool OR reduction was 7x an int32 count's IR on
    one machine of this kind and the same size on an AVX-512 one, so no test pins that
    ratio), and more trivial kernels cost more IR to compile."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    output = tmp_path / "forms.json"
    # XLA's default code generation, as the library and the benchmark's users get it: not
    # this test run's faster-compiling flags (tests/conftest.py).
    env = {k: v for k, v in os.environ.items() if k != "JAX_DISABLE_MOST_OPTIMIZATIONS"}
    env["XLA_FLAGS"] = env.get("XLA_FLAGS", "").replace(
        "--xla_cpu_use_fusion_emitters=false", "").strip()
    forms_asked = ["any_bool", "count_int32", "trivial_kernels_10", "trivial_kernels_100"]
    subprocess.run([sys.executable, os.path.join(root, "benchmarks", "kernel_forms.py"),
                    "--rounds", "1", "--forms", *forms_asked, "--output", str(output)],
                   check=True, timeout=600, capture_output=True, env=env)
    results = json.loads(output.read_text())
    forms = results["forms"]
    assert sorted(forms) == sorted(forms_asked)
    for form in forms.values():
        assert form["llvm_ir_bytes"] > 1000 and len(form["compile_s"]) == 1
        assert form["median_compile_s"] > 0
    assert isinstance(results["machine"]["cpu_model"], str)
    assert all(isinstance(flag, str) for flag in results["machine"]["cpu_vector_extensions"])
    assert (forms["trivial_kernels_100"]["llvm_ir_bytes"]
            > 5 * forms["trivial_kernels_10"]["llvm_ir_bytes"])
    assert results["compile_s_per_trivial_kernel"] > 0


@pytest.mark.parametrize("pair", ["any_bool/count_int32", "and_broadcast/select_broadcast",
                                  "cast_and/select_float"])
def test_kernel_forms__the_two_forms_of_each_pair_compute_the_same_values(pair, monkeypatch):
    """The README compares the pairs' compile cost as equivalent code: each pair computes
    the same values, for flags with every bit pattern and every step count."""
    import importlib
    import os

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "benchmarks"))
    kernel_forms = importlib.import_module("kernel_forms")
    rng = np.random.default_rng(0)
    first, second = pair.split("/")
    fn_a, shapes = kernel_forms._program(first)
    fn_b, shapes_b = kernel_forms._program(second)
    assert [(s.shape, s.dtype) for s in shapes] == [(s.shape, s.dtype) for s in shapes_b]
    one_failure = np.zeros((kernel_forms.T, kernel_forms.B), np.uint8)
    one_failure[kernel_forms.T - 1, 3] = 4
    cases = 0
    for flags in (np.zeros((kernel_forms.T, kernel_forms.B), np.uint8), one_failure,
                  rng.integers(0, 8, (kernel_forms.T, kernel_forms.B), dtype=np.uint8),
                  np.full((kernel_forms.T, kernel_forms.B), 4, np.uint8)):
        if len(shapes) == 1:
            extra_inputs = [()]
        elif shapes[1].shape == ():
            extra_inputs = [(jnp.int32(n),) for n in (0, 1, 17, kernel_forms.T)]
        else:
            extra_inputs = [(rng.random(shapes[1].shape) < p,) for p in (0.0, 0.5, 1.0)]
        for extra in extra_inputs:
            a = jax.jit(fn_a)(flags, *extra)
            b = jax.jit(fn_b)(flags, *extra)
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            cases += 1
    assert cases >= 3


def test_time_to_solve_fresh__ratios_of_startup_and_mean_run_per_round():
    """`summarize_fresh`: each ratio is the median over rounds of that round's
    fused-over-bare ratio; the expected time to solve charges each side its startup and
    its mean run over the blocks of seeds (made-up seconds, no timing involved)."""
    from benchmarks.time_to_solve import summarize_fresh

    def side(startup, runs, updates):
        return {"startup_s": startup, "compile_s": startup - 0.5, "run_s": runs,
                "updates": updates}

    rounds = [{"bare": side(4.0, [1.0, 3.0], [[10, 12], [30, 20]]),
               "fused": side(5.0, [2.0, 1.0], [[11, 9], [15, 14]])},
              {"bare": side(4.0, [1.0, 3.0], [[10, 12], [30, 20]]),
               "fused": side(6.0, [2.0, 1.0], [[11, 9], [15, 14]])},
              {"bare": side(6.0, [1.0, 3.0], [[10, 12], [30, 20]]),
               "fused": side(6.0, [2.0, 1.0], [[11, 9], [15, 14]])}]
    out = summarize_fresh(rounds)
    assert out["startup"] == pytest.approx(1.25)  # median of 1.25, 1.5, 1.0
    assert out["time_to_solve_first_block"] == pytest.approx(7.0 / 5.0)  # 7/5, 8/5, 8/7
    assert out["expected_time_to_solve"] == pytest.approx(6.5 / 6.0)  # 6.5/6, 7.5/6, 7.5/8
    assert out["expected_run"] == pytest.approx(0.75)
    assert out["slowest_seed_updates_per_block"] == {"bare": [12, 30], "fused": [11, 15]}
    assert out["mean_updates_per_seed"] == {"bare": 18.0, "fused": 12.25}
    assert out["median_startup_s"] == {"bare": 4.0, "fused": 6.0}


def test_time_to_solve_fused_loops__the_library_loop_stops_where_the_hand_written_one_does():
    """`make_fused_train(loop="make_train")` (PPOLearner.make_train's loop to a target,
    which `--fused-loop make_train` measures) and the benchmark's hand-written loop need
    the same updates per seed and end at the same ring mean, a seed stopping early."""
    import dataclasses

    import jax
    import numpy as np

    from benchmarks import time_to_solve as tts

    hp = dataclasses.replace(tts.HYPER["CartPole-v1"], target=25.0, hiddens=(8,),
                             num_steps=32)
    out = {loop: jax.device_get(jax.jit(jax.vmap(tts.make_fused_train(
        "CartPole-v1", hp, max_updates=8, loop=loop)))(tts.seed_keys(2)))
        for loop in tts.FUSED_LOOPS}
    (hand_updates, hand_mean), (library_updates, library_mean) = out["hand"], out["make_train"]
    np.testing.assert_array_equal(library_updates, hand_updates)
    np.testing.assert_array_equal(library_mean, hand_mean)
    assert hand_updates.min() < 8  # a seed reached the target and stopped
    assert (hand_mean[hand_updates < 8] >= hp.target).all()


def test_time_to_solve_fresh__each_side_in_its_own_process_runs_every_block(tmp_path):
    """`time_to_solve.py --fused-fresh` with one round of two blocks of one seed, one
    update each: both sides ran in fresh processes, each block is recorded, the fused
    side's build is timed apart from its compile."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, os.path.join(root, "benchmarks", "time_to_solve.py"),
                    "--fused-fresh", "--envs", "CartPole-v1", "--fused-seeds", "1",
                    "--rounds", "1", "--seed-blocks", "2", "--max-updates", "1",
                    "--output-dir", str(tmp_path)], check=True, timeout=600,
                   capture_output=True)
    result = json.loads((tmp_path / "time_to_solve_fused_fresh.json").read_text())
    (run,) = result["runs"]
    assert run["num_seeds"] == 1 and run["seed_blocks"] == 2
    (round_,) = run["rounds"]
    for side in ("bare", "fused"):
        r = round_[side]
        assert r["side"] == side and len(r["run_s"]) == 2 and r["updates"] == [[1], [1]]
        assert 0 < r["build_s"] < r["startup_s"] and r["compile_s"] > 0
    assert run["same_updates_every_round"]
    assert run["ratio_fused_over_bare"]["expected_time_to_solve"] > 0
