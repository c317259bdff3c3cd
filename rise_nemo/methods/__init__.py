"""The method registry (``registry``) and one module per method or family, each registering its methods and
declaring the pieces they introduce. Importing the package imports every module in it, so a method added as a
new file here is known to the config loader, the planner and the trainer alike.

Nothing here imports torch or the steps: the registry is read where no model is built (`rise-nemo plan`).
"""

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
