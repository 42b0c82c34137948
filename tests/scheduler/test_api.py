"""The public names of ``scheduler`` stay functions whatever was imported first."""

import importlib


def test_trace_apply_fit_are_functions_after_importing_every_submodule():
    import scheduler

    for mod in ("tracing.tracer", "applying.graph", "measuring.verification", "comparing.run", "sizing.search", "measuring.storages",
                "sizing.floor", "sizing.memory"):
        importlib.import_module(f"scheduler.{mod}")
    for name in ("trace", "apply", "fit", "solve", "simulate"):
        obj = getattr(scheduler, name)
        assert callable(obj) and not isinstance(obj, type(scheduler)), name


def test_importing_scheduler_does_not_import_torch_eagerly():
    import subprocess
    import sys

    code = "import sys, scheduler; scheduler.solve; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
