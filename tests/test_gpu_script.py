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


def test_gpu_script__runs_without_ray_at_tiny_size(tmp_path):
    output = tmp_path / "gpu.json"
    code = _NO_RAY + (
        "import runpy, sys\n"
        f"sys.argv = [{str(SCRIPT)!r}, '--allow-cpu', '--num-envs', '4', '--num-steps', '4',"
        f" '--rounds', '1', '--output', {str(output)!r}]\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu",
                                              "JAX_DISABLE_MOST_OPTIMIZATIONS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(output.read_text())
    assert data["backend"] == "cpu" and data["ray_imported"] is False
    assert len(data["load_avg"]) == 3
    assert [(c["num_envs"], c["random_actions"]) for c in data["cases"]] == [(4, True),
                                                                             (4, False)]
    for case in data["cases"]:
        assert "error" not in case, case
        assert set(case["steps_per_s"]) == {"jaxrunner", "jaxrunner_partial_reset",
                                            "bare_scan"}
        assert all(v > 0 for v in case["steps_per_s"].values())
        assert set(case["first_sample_s"]) == {"jaxrunner", "jaxrunner_partial_reset"}
