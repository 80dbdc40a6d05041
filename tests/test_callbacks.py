"""Device callbacks and custom metrics against the returned episodes (a plain-Python
reference over the host episodes), the group merge against pooled values, host callbacks,
build-time errors, state/checkpoint round trips and the zero-cost promise."""

from __future__ import annotations

import copy

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments.classic_control.cartpole import CartPole

import jaxrunner
from jaxrunner.core.callbacks import CallbackError
from jaxrunner.distributed.metrics import GroupCounters, aggregate
from jaxrunner.testing.envs import FlakyEnv

from conftest import make_config, whole_episodes
from multi_agent_helpers import relay_creator
from multi_agent_helpers import whole_episodes as whole_ma_episodes

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS, FRAGMENT = 4, 40


class InfoCartPole(CartPole):
    """CartPole whose step info says whether the cart was pushed right."""

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        info = dict(info)
        info["pushed_right"] = (action == 1).astype(jnp.int32)
        return obs, state, reward, done, info


def info_cartpole(context):
    env = InfoCartPole()
    return env, env.default_params


def start(view):
    return {"max_x": jnp.zeros((), jnp.float32), "right": jnp.zeros((), jnp.int32)}


def step(state, view):
    return {"max_x": jnp.maximum(state["max_x"], jnp.abs(view.obs[0])),
            "right": state["right"] + view.info["pushed_right"]}


def end(state, view):
    return {"max_abs_x": state["max_x"], "right_pushes": state["right"],
            "one": jnp.float32(1.0), "ended_terminated": view.terminated,
            "x_last3": state["max_x"], "one_last4": jnp.float32(1.0)}


CUSTOM = {"max_abs_x": "max", "right_pushes": {"reduce": "mean"}, "one": "sum",
          "ended_terminated": jaxrunner.MetricSpec("sum", clear_on_reduce=True),
          "x_last3": jaxrunner.MetricSpec("max", window=3),
          "one_last4": {"reduce": "sum", "window": 4}}

SEEN = {"created": 0, "host_episode_ends": 0, "sample_ends": 0}


def created(*, env_runner, metrics_logger, env, env_context):
    SEEN["created"] += 1
    assert env is env_runner.env


def host_episode_end(*, episode, env_runner, metrics_logger, env_index):
    SEEN["host_episode_ends"] += 1
    metrics_logger.log_value("host_len", len(episode), reduce="max")


def sample_end(*, env_runner, metrics_logger, samples):
    SEEN["sample_ends"] += 1
    metrics_logger.log_value("batch_steps", samples.env_steps, reduce="sum",
                             clear_on_reduce=True)


def callback_config(env=info_cartpole, host_episode_ends=False, **kwargs):
    config = (make_config(env, num_envs=NUM_ENVS, fragment=FRAGMENT, **kwargs)
              .reporting(metrics_num_episodes_for_smoothing=1000)
              .callbacks(on_episode_start=start, on_episode_step=step, on_episode_end=end,
                         custom_metrics=CUSTOM, on_environment_created=created,
                         on_sample_end=sample_end))
    if host_episode_ends:  # host and device on_episode_end cannot both be set
        config.callbacks(on_episode_end=jaxrunner.on_host(host_episode_end))
    return config


@pytest.fixture(scope="module")
def runner():
    r = jaxrunner.SingleAgentEnvRunner(config=callback_config())
    yield r
    r.stop()


def reference(episode) -> dict:
    obs = np.asarray(episode.observations)[:len(episode)]  # the observations acted on
    return {"max_abs_x": float(np.max(np.abs(obs[:, 0]))),
            "right_pushes": int(np.sum(np.asarray(episode.actions) == 1))}


def test_custom_metrics_equal_the_returned_episodes(runner):
    """Episodes cut across calls are measured once, whole; values and reductions match
    the same quantities computed from the returned (joined) episodes."""
    runner.get_metrics()
    batches = [runner.sample(num_timesteps=NUM_ENVS * 30) for _ in range(4)]
    by_id, finished = whole_episodes(batches)
    metrics = runner.get_metrics()
    window = runner.get_metrics_window()["custom_metrics"]
    refs = [reference(by_id[i]) for i in finished if i in by_id]
    assert metrics["num_episodes"] >= len(refs) > 3
    # Episodes whose start was before the first batch also count on the device: compare
    # the newest values (the ring is in end order; the whole episodes are the newest).
    got_x = np.sort(window["max_abs_x"]["values"][-len(refs):])
    want_x = np.sort([r["max_abs_x"] for r in refs])
    new_only = metrics["num_episodes"] == len(refs)
    if new_only:
        np.testing.assert_allclose(got_x, want_x, rtol=1e-6)
        np.testing.assert_array_equal(
            np.sort(window["right_pushes"]["values"]),
            np.sort([r["right_pushes"] for r in refs]).astype(np.float64))
        assert metrics["max_abs_x"] == pytest.approx(max(want_x), rel=1e-6)
        assert metrics["right_pushes"] == pytest.approx(
            np.mean([r["right_pushes"] for r in refs]))
    else:  # the oldest finished episodes started before the first batch
        assert set(np.round(want_x, 5)) <= set(np.round(window["max_abs_x"]["values"], 5))
    assert metrics["one"] == metrics["num_episodes_lifetime"]  # lifetime sum
    terminated = sum(bool(by_id[i].is_terminated) for i in finished)
    assert metrics["ended_terminated"] >= terminated  # since the last call
    if new_only:  # every counted episode is one of the returned ones
        assert metrics["ended_terminated"] == terminated
    # Windowed metrics reduce the newest values of their own window only.
    newest = window["max_abs_x"]["values"][-3:]
    np.testing.assert_array_equal(window["x_last3"]["values"], newest)
    assert metrics["x_last3"] == pytest.approx(newest.max())
    assert metrics["one_last4"] == 4.0
    assert runner.get_metrics()["ended_terminated"] == 0.0  # cleared on reduce
    assert runner.get_metrics()["one"] == metrics["one"]  # lifetime kept


def test_custom_metrics_when_chunks_stop_early_for_the_row_store():
    """The episodes' callback values ride beside the final-observation store's episode-end
    rows: with one row per sub-env (chunks stop early after a few ends) and with a row for
    every step, the custom metrics are the same and equal the returned episodes'."""
    windows, metrics = [], []
    for slots in (1, FRAGMENT):
        r = jaxrunner.SingleAgentEnvRunner(
            config=callback_config(final_obs_slots_per_env=slots))
        batches = [r.sample(num_timesteps=NUM_ENVS * 30) for _ in range(3)]
        by_id, finished = whole_episodes(batches)
        window = r.get_metrics_window()["custom_metrics"]
        got = r.get_metrics()
        refs = [reference(by_id[i]) for i in finished]
        assert got["num_episodes"] == len(refs) > 3  # a fresh runner: every one returned
        np.testing.assert_allclose(np.sort(window["max_abs_x"]["values"]),
                                   np.sort([x["max_abs_x"] for x in refs]), rtol=1e-6)
        np.testing.assert_array_equal(np.sort(window["right_pushes"]["values"]),
                                      np.sort([x["right_pushes"] for x in refs]))
        windows.append(window)
        metrics.append({k: got[k] for k in CUSTOM})
        r.stop()
    assert metrics[0] == metrics[1]
    for name in CUSTOM:
        np.testing.assert_array_equal(windows[0][name]["values"], windows[1][name]["values"])


@pytest.mark.parametrize("mode", ["random", pytest.param("inference", marks=pytest.mark.slow)])
def test_episode_mode_in_other_policy_modes(runner, mode):
    runner.get_metrics()
    kwargs = {"random_actions": True} if mode == "random" else {"explore": False}
    batch = runner.sample(num_episodes=5, **kwargs)
    metrics = runner.get_metrics()
    refs = [reference(e) for e in batch]
    assert len(refs) == 5 and metrics["num_episodes"] == 5
    window = runner.get_metrics_window()["custom_metrics"]
    np.testing.assert_array_equal(np.sort(window["right_pushes"]["values"][-5:]),
                                  np.sort([r["right_pushes"] for r in refs]))
    np.testing.assert_allclose(np.sort(window["max_abs_x"]["values"][-5:]),
                               np.sort([r["max_abs_x"] for r in refs]), rtol=1e-6)


def test_state_round_trip_continues_the_measurement(runner):
    runner.sample(num_timesteps=NUM_ENVS * 7)  # episodes in flight
    state = runner.get_state(components="all")
    other = jaxrunner.SingleAgentEnvRunner(config=callback_config())
    other.set_state(copy.deepcopy(state))
    for r in (runner, other):
        r.get_metrics()
        r.sample(num_timesteps=NUM_ENVS * 25)
    a, b = runner.get_metrics(), other.get_metrics()
    for name in CUSTOM:
        assert a[name] == pytest.approx(b[name]), name
    np.testing.assert_array_equal(runner.get_metrics_window()["custom_metrics"]["max_abs_x"][
        "values"], other.get_metrics_window()["custom_metrics"]["max_abs_x"]["values"])
    other.stop()


def test_no_compiles_after_warm_up(runner, compile_counter):
    runner.sample(num_timesteps=NUM_ENVS * 3)
    runner.get_metrics()
    compile_counter.reset()
    for n in (1, 9, 17):
        runner.sample(num_timesteps=NUM_ENVS * n)
        runner.get_metrics()
    assert compile_counter.count == 0, compile_counter.messages


def _chunk_jaxpr(r, config) -> str:
    """The jaxpr of the compiled chunk of runner `r`'s env and module with `config`'s
    callbacks, built from public pieces."""
    from jaxrunner.callbacks import device_callbacks
    from jaxrunner.core.rollout import RolloutSpec, make_rollout_fns
    from jaxrunner.envs.spaces import action_dtype

    spec = RolloutSpec(
        env=r.env, module=r.module, action_space=r.action_space,
        env_action_dtype=action_dtype(r.env.action_space(r.env_params)),
        num_envs=r.num_envs, chunk_len=4, lookback_len=1, metrics_window=5,
        env_to_module=r.env_to_module, module_to_env=r.module_to_env,
        callbacks=device_callbacks(config))
    fns = make_rollout_fns(spec, "explore")
    params = jax.device_put(r.get_state()["rl_module"])
    carry = jax.eval_shape(fns.init_carry, jax.random.key(0), params, r.env_params)
    lookback = jax.eval_shape(fns.init_lookback, carry, params, r.env_params)
    return str(jax.make_jaxpr(fns.chunk)(carry, lookback, params, r.env_params,
                                         np.int32(4), np.int32(9), np.int32(9), np.int32(0)))


def test_not_configured_is_the_same_program():
    """Host callbacks leave the compiled chunk alone; device ones add to it."""
    host_only = make_config(num_envs=2, fragment=4).callbacks(
        on_sample_end=lambda **kw: None, on_episode_end=jaxrunner.on_host(lambda **kw: None))
    r = jaxrunner.SingleAgentEnvRunner(config=host_only)
    plain = _chunk_jaxpr(r, make_config(num_envs=2, fragment=4))
    assert _chunk_jaxpr(r, host_only) == plain
    device = make_config(num_envs=2, fragment=4).callbacks(
        on_episode_end=lambda s, v: {"r": v.reward})
    assert _chunk_jaxpr(r, device) != plain
    r.stop()


@pytest.mark.parametrize("kwargs, needle", [
    (dict(on_episode_start=lambda v: jnp.zeros(()),
          on_episode_step=lambda s, v: s + float(v.reward),
          on_episode_end=lambda s, v: {"x": s}), "on_episode_step"),
    (dict(on_episode_end=lambda s, v: {"x": v.obs}), "shape (4,)"),
    (dict(on_episode_start=lambda v: jnp.zeros((), jnp.int32),
          on_episode_step=lambda s, v: s + v.reward,
          on_episode_end=lambda s, v: {"x": s}), "changed its state's structure"),
    (dict(on_episode_end=lambda s, v: [v.reward]), "must return a"),
    (dict(on_episode_step=lambda s, v: s, on_episode_end=lambda s, v: {"x": v.reward}),
     "needs on_episode_start"),
    (dict(on_episode_end=lambda s, v: {"x": v.reward}, custom_metrics={"y": "max"}),
     "does not return"),
])
def test_bad_callbacks_fail_at_build_naming_the_callback(kwargs, needle):
    config = make_config(num_envs=2, fragment=4).callbacks(**kwargs)
    with pytest.raises((CallbackError, ValueError)) as info:
        jaxrunner.SingleAgentEnvRunner(config=config)
    assert needle in str(info.value)
    assert "on_episode" in str(info.value)


def test_bad_metric_specs_fail_in_config():
    with pytest.raises(ValueError, match="reduce must be one of"):
        jaxrunner.RunnerConfig().callbacks(custom_metrics={"x": "median"})
    with pytest.raises(ValueError, match="RLlib's own metric"):
        jaxrunner.RunnerConfig().callbacks(custom_metrics={"episode_return_mean": "max"})


def test_failed_episodes_are_dropped_with_their_metrics():
    inner, params = gymnax.make("CartPole-v1")
    flaky = FlakyEnv(inner, period=40)
    config = (make_config(lambda ctx: (flaky, params), num_envs=NUM_ENVS, fragment=FRAGMENT)
              .fault_tolerance(restart_failed_sub_environments=True)
              .reporting(metrics_num_episodes_for_smoothing=1000)
              .callbacks(on_episode_start=lambda v: jnp.zeros((), jnp.int32),
                         on_episode_step=lambda s, v: s + 1,
                         on_episode_end=lambda s, v: {"steps": s, "one": jnp.float32(1)},
                         custom_metrics={"steps": "sum", "one": "sum"}))
    r = jaxrunner.SingleAgentEnvRunner(config=config)
    batches = [r.sample(num_timesteps=NUM_ENVS * 60) for _ in range(3)]
    metrics = r.get_metrics()
    assert metrics["num_env_step_failures"] > 0
    assert metrics["one"] == metrics["num_episodes_lifetime"]
    window = r.get_metrics_window()
    # Only counted (not failed) episodes are in the ring, in the same order as the
    # episode-length ring: the step counts are the episode lengths.
    np.testing.assert_array_equal(np.asarray(window["episode_len"], np.float64),
                                  window["custom_metrics"]["steps"]["values"])
    by_id, finished = whole_episodes(batches)
    assert all(by_id[i].is_done for i in finished)
    r.stop()


def test_host_callbacks(runner):
    """on_environment_created ran once at build, on_sample_end after every sample(), and
    what they log is in get_metrics()."""
    assert SEEN["created"] >= 1
    runner.get_metrics()
    before = SEEN["sample_ends"]
    runner.sample(num_timesteps=NUM_ENVS * 5)
    runner.sample(num_timesteps=NUM_ENVS * 6)
    assert SEEN["sample_ends"] == before + 2
    assert runner.get_metrics()["batch_steps"] == NUM_ENVS * 11
    assert runner.get_metrics()["batch_steps"] == 0.0  # clear_on_reduce


def test_host_episode_end_sees_every_finished_episode():
    config = make_config(num_envs=2, fragment=30).callbacks(
        on_episode_end=jaxrunner.on_host(host_episode_end))
    r = jaxrunner.SingleAgentEnvRunner(config=config)
    before = SEEN["host_episode_ends"]
    batches = [r.sample() for _ in range(2)]
    done = [e for b in batches for e in b if e.is_done]
    assert SEEN["host_episode_ends"] - before == len(done) > 0
    assert r.get_metrics()["host_len"] == max(len(e) for e in done)
    r.stop()


def test_metrics_logger_reductions():
    logger = jaxrunner.MetricsLogger(episode_window=3)
    for value in (1, 5, 2, 4):
        logger.log_value("m", value)  # mean over the last 3
        logger.log_value("lo", value, reduce="min", window=2)
        logger.log_value("total", value, reduce="sum")
        logger.log_value("calls", 1, reduce="sum", clear_on_reduce=True)
    assert logger.reduce() == {"m": pytest.approx(11 / 3), "lo": 2.0, "total": 12.0,
                               "calls": 4.0}
    logger.log_value("total", 1, reduce="sum")
    assert logger.reduce() == {"m": pytest.approx(11 / 3), "lo": 2.0, "total": 13.0,
                               "calls": 0.0}
    with pytest.raises(ValueError, match="keeps its reduce"):
        logger.log_value("m", 1.0, reduce="max")
    with pytest.raises(ValueError, match="single number"):
        logger.log_value("v", [1.0, 2.0])
    # Names of device callback metrics are refused, given at construction or later.
    with pytest.raises(ValueError, match="device callback metric"):
        jaxrunner.MetricsLogger(reserved=("dev",)).log_value("dev", 1.0)
    logger.reserve(["later"])
    with pytest.raises(ValueError, match="device callback metric"):
        logger.log_value("later", 1.0)
    with pytest.raises(ValueError, match="logged before"):
        logger.reserve(["m"])


def test_group_merge_is_the_pooled_value(runner):
    """`aggregate` (what EnvRunnerGroup.get_metrics runs) over two runners' reports equals
    the reductions of the pooled episodes."""
    other = jaxrunner.SingleAgentEnvRunner(config=callback_config(seed=5), worker_index=2)
    runners = [runner, other]
    counters = GroupCounters()
    runner.get_metrics()
    for calls in (1, 2):
        for r in runners:
            r.sample(num_timesteps=NUM_ENVS * 40 * calls)
        parts = [(r.get_metrics(), r.get_metrics_window()) for r in runners]
        merged = aggregate(parts, counters)
    pooled = {name: np.concatenate([w["custom_metrics"][name]["values"] for _, w in parts])
              for name in CUSTOM}
    assert merged["max_abs_x"] == pytest.approx(pooled["max_abs_x"].max())
    assert merged["right_pushes"] == pytest.approx(pooled["right_pushes"].mean())
    sizes = [len(w["custom_metrics"]["right_pushes"]["values"]) for _, w in parts]
    per_runner_means = [w["custom_metrics"]["right_pushes"]["values"].mean() for _, w in parts]
    if sizes[0] != sizes[1]:
        assert merged["right_pushes"] != pytest.approx(np.mean(per_runner_means))
    # Lifetime sums are the group's: the sums of the per-call sums of both calls.
    assert merged["one"] == merged["num_episodes_lifetime"]
    assert merged["ended_terminated"] == pytest.approx(
        sum(m["ended_terminated"] for m, _ in parts))
    assert merged["batch_steps"] == NUM_ENVS * 80 * 2  # host-logged sums add
    other.stop()


def test_multi_agent_callbacks_per_agent():
    def ma_start(view):
        return {"steps": jnp.zeros((), jnp.int32), "a_acted": jnp.zeros((), jnp.int32),
                "c_reward": jnp.zeros((), jnp.float32)}

    def ma_step(state, view):
        return {"steps": state["steps"] + 1,
                "a_acted": state["a_acted"] + view.acting["a"].astype(jnp.int32),
                "c_reward": state["c_reward"] + view.reward["c"]}

    def ma_end(state, view):
        return {"env_steps": state["steps"], "a_acted": state["a_acted"],
                "c_reward": state["c_reward"],
                "truncated": view.truncated["__all__"].astype(jnp.float32)}

    config = (jaxrunner.RunnerConfig().environment(relay_creator)
              .env_runners(num_envs_per_env_runner=3, rollout_fragment_length=5)
              .multi_agent(policies={"p0", "p1"},
                           policy_mapping_fn=lambda aid, ep: "p0" if aid == "a" else "p1")
              .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=3)
              .reporting(metrics_num_episodes_for_smoothing=1000)
              .callbacks(on_episode_start=ma_start, on_episode_step=ma_step,
                         on_episode_end=ma_end, custom_metrics={"truncated": "sum"}))
    r = jaxrunner.MultiAgentEnvRunner(config=config)
    batches = [r.sample(num_timesteps=21) for _ in range(3)]
    by_id, finished = whole_ma_episodes(batches)
    window = r.get_metrics_window()["custom_metrics"]
    n = len(finished)
    assert n > 2
    eps = [by_id[i] for i in finished]
    np.testing.assert_array_equal(np.sort(window["env_steps"]["values"][-n:]),
                                  np.sort([e.env_steps() for e in eps]))
    np.testing.assert_array_equal(np.sort(window["a_acted"]["values"][-n:]),
                                  np.sort([np.asarray(e.acted["a"]).sum() for e in eps]))
    np.testing.assert_allclose(np.sort(window["c_reward"]["values"][-n:]),
                               np.sort([np.asarray(e.env_rewards["c"]).sum() for e in eps]),
                               rtol=1e-5)
    metrics = r.get_metrics()
    assert metrics["truncated"] == metrics["num_episodes_lifetime"]  # Relay truncates
    r.stop()


@pytest.mark.slow
def test_rllib_dropin_calls_on_episode_end_for_finished_episodes():
    pytest.importorskip("ray.rllib")
    pytest.importorskip("torch")
    from ray.rllib.algorithms.ppo import PPOConfig

    from jaxrunner.rllib import JaxEnvRunner

    ended = []
    earlier_chunks = {}

    def on_episode_end(*, episode, env_runner, metrics_logger, env_index,
                       prev_episode_chunks, **kwargs):
        ended.append((episode.id_, episode.is_done, env_index))
        earlier_chunks[episode.id_] = (episode, prev_episode_chunks)
        metrics_logger.log_value("len_seen", len(episode), reduce="sum")

    config = (PPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=2,
                           rollout_fragment_length=40)
              .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0)
              .callbacks(on_episode_end=on_episode_end))
    runner = JaxEnvRunner(config=config)
    episodes = runner.sample()
    done = [e for e in episodes if e.is_done]
    assert len(done) > 0
    assert sorted(i for i, _, _ in ended) == sorted(e.id_ for e in done)
    assert all(flag and index in (0, 1) for _, flag, index in ended)
    assert runner.get_metrics()["len_seen"] == sum(len(e) for e in done)
    # As RLlib: prev_episode_chunks holds the episode's earlier chunks this runner
    # returned, so [*prev_episode_chunks, episode] is the whole episode.
    assert all(prev == [] for _, prev in earlier_chunks.values())  # first call: no cuts
    returned = {}
    for batch in [episodes] + [runner.sample() for _ in range(3)]:
        for chunk in batch:
            returned.setdefault(chunk.id_, []).append(chunk)
    spanning = 0
    for id_, (episode, prev) in earlier_chunks.items():
        if episode.t_started == 0 or id_ not in returned:
            continue
        spanning += 1
        assert [id(c) for c in prev] == [id(c) for c in returned[id_][:-1]]
        assert returned[id_][-1] is episode
        assert [c.t_started for c in prev + [episode]] == list(
            np.cumsum([0] + [len(c) for c in prev]))
    assert spanning > 0
    runner.stop()
