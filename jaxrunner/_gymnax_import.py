"""Imports gymnax without paying for the plotting libraries its env modules import.

`import gymnax` imports every gymnax environment, and five of them (Pong, Rooms,
PointRobot, MetaMaze, Catch) import `matplotlib.pyplot` and `seaborn` at the top of their
module for their `render` methods alone. seaborn brings scipy.stats and pandas: together
about 3 of the 4 seconds `import jaxrunner` took on a 2-core CPU, paid again in every
process that imports jaxrunner (each Ray runner actor, each CLI call).

While gymnax imports, those two names resolve to stand-ins that import the real module on
the first attribute read (`plt.subplots`, `sns.color_palette` inside `render`). The
stand-ins leave `sys.modules` as soon as gymnax is imported, so everyone else's
`import seaborn` / `import matplotlib.pyplot` is the ordinary import.
"""

from __future__ import annotations

import importlib
import sys
import types

# What gymnax's env modules import for rendering only.
RENDER_ONLY_MODULES = ("seaborn", "matplotlib.pyplot")


class _ImportedOnFirstUse(types.ModuleType):
    """A module object that imports the module it names when an attribute is first read."""

    def __getattr__(self, attribute: str):
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        module = importlib.import_module(self.__name__)
        return getattr(module, attribute)


def import_gymnax() -> types.ModuleType:
    """`import gymnax`, with its render-only imports deferred to their first use.

    A no-op beyond `import gymnax` when gymnax, or the plotting module, is imported
    already.
    """
    if "gymnax" in sys.modules:
        return sys.modules["gymnax"]
    stand_ins = {}
    for name in RENDER_ONLY_MODULES:
        if name not in sys.modules:
            stand_ins[name] = sys.modules[name] = _ImportedOnFirstUse(name)
    try:
        import gymnax
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
    return gymnax
