"""`import jaxrunner` imports gymnax without the plotting stack gymnax's env modules import
for rendering (seaborn brings scipy.stats and pandas: most of the import's seconds), and
rendering, and everyone else's imports of those modules, still work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PLOTTING_STACK = ("seaborn", "matplotlib.pyplot", "scipy.stats", "pandas")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"})


def test_import__leaves_the_plotting_stack_unimported_until_a_render_uses_it():
    result = _run(f"""
        import sys, types
        import jaxrunner
        import gymnax
        from gymnax.environments.bsuite import catch
        from gymnax.environments.misc import pong

        loaded = [m for m in {PLOTTING_STACK!r} if m in sys.modules]
        assert not loaded, loaded
        # gymnax's render-time names import the real module on first use ...
        palette = pong.sns.color_palette("cubehelix", 3)
        assert len(palette) == 3, palette
        figure, _ = catch.plt.subplots()
        assert type(sys.modules["seaborn"]) is types.ModuleType
        assert type(sys.modules["matplotlib.pyplot"]) is types.ModuleType
        # ... and the user's own imports are the ordinary modules, the same objects.
        import seaborn, matplotlib.pyplot as plt
        assert seaborn is sys.modules["seaborn"] and plt is sys.modules["matplotlib.pyplot"]
        assert plt.gcf() is figure and seaborn.color_palette is pong.sns.color_palette
        print("OK")
    """)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "OK" in result.stdout


def test_import__plotting_modules_imported_first_are_kept_as_they_are():
    result = _run("""
        import sys
        import seaborn
        import jaxrunner
        from gymnax.environments.misc import pong
        assert pong.sns is seaborn and sys.modules["seaborn"] is seaborn
        print("OK")
    """)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "OK" in result.stdout
