"""`benchmarks/gpu.py` runs where Ray is not installed (the GPU hosts): a tiny CPU run with
every `import ray` failing writes its JSON with all three samplers' figures."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from test_import_without_ray import _NO_RAY

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"


def _run_script(output: pathlib.Path, *args: str, script: pathlib.Path = SCRIPT) -> dict:
    """Runs `script` on the CPU with every `import ray` failing; its JSON output."""
    if script == SCRIPT:
        args = ("--allow-cpu", "--rounds", "1") + args
    code = _NO_RAY + (
        "import runpy, sys\n"
        f"sys.argv = [{str(script)!r}, '--num-steps', '4', '--output', {str(output)!r},"
        f" *{list(args)!r}]\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu",
                                              "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(output.read_text())


def test_gpu_script__runs_without_ray_at_tiny_size(tmp_path):
    data = _run_script(tmp_path / "gpu.json", "--num-envs", "4", "--ablations")
    assert data["backend"] == "cpu" and data["ray_imported"] is False
    assert len(data["load_avg"]) == 3
    assert [(c["num_envs"], c["random_actions"]) for c in data["cases"]] == [(4, True),
                                                                             (4, False)]
    for case in data["cases"]:
        assert "error" not in case, case
        assert set(case["steps_per_s"]) == {
            "jaxrunner", "jaxrunner_partial_reset", "bare_scan",
            "jaxrunner_loop_test_every_step", "jaxrunner_loop_test_every_64",
            "jaxrunner_joined_finite_check", "jaxrunner_columns_finite_check",
            "jaxrunner_no_finite_check"}
        assert all(v > 0 for v in case["steps_per_s"].values())
        assert set(case["first_sample_s"]) == set(case["steps_per_s"])


def test_gpu_script__time_budget_skips_the_cases_left_and_still_writes_json(tmp_path):
    data = _run_script(tmp_path / "gpu.json", "--num-envs", "4", "8", "--time-budget", "0",
                       "--order", "largest-first")
    assert data["cases"] == [
        {"num_envs": n, "random_actions": r, "skipped": "time budget spent"}
        for r, n in ((True, 4), (True, 8), (False, 4), (False, 8))]
    assert data["elapsed_s"] >= 0


def test_gpu_profile_script__summarises_kernels_per_side_without_ray(tmp_path):
    """`benchmarks/gpu_profile.py` at tiny size on the CPU: each side's profile has its
    call time, event count and top events (host XLA ops here; GPU kernels on a GPU)."""
    data = _run_script(tmp_path / "profile.json", "--num-envs", "4", "--trace-dir",
                       str(tmp_path / "traces"), script=SCRIPT.with_name("gpu_profile.py"))
    case, = data["cases"]
    assert case["num_envs"] == 4
    for side in ("jaxrunner", "jaxrunner_no_finite_check", "bare_scan"):
        profile = case[side]
        assert profile["wall_us_per_call_traced"] > 0 and profile["kernels_per_call"] > 0
        assert profile["top_kernels"] and all(k["us_per_call"] >= 0
                                              for k in profile["top_kernels"])


def test_switched__sets_a_module_switch_inside_the_block_and_restores_it_on_error():
    from jaxrunner.benchmarking import switched
    from jaxrunner.core import faults

    default = faults.SMALL_LEAVES_CHECK
    try:
        with switched(faults, "SMALL_LEAVES_CHECK", "columns"):
            assert faults.SMALL_LEAVES_CHECK == "columns"
            raise RuntimeError("a side failed to build")
    except RuntimeError:
        pass
    assert faults.SMALL_LEAVES_CHECK == default
