"""`jax_amem.reshard.plan` is the verb (a function); the module that holds the Plan type and its
columns is `jax_amem.reshard.plan_data`. No module shares a name with a function its package
exports, so `import jax_amem.reshard.<module> as m` always gives the module."""

import importlib
import inspect
import pkgutil

import jax_amem
from jax_amem import reshard


def test_plan_is_the_function_and_plan_data_the_module():
    module = importlib.import_module("jax_amem.reshard.plan_data")
    assert inspect.ismodule(module)
    assert inspect.isfunction(reshard.plan) and reshard.plan is jax_amem.plan
    assert module.Plan is reshard.Plan and module.TRANSFER_COLUMNS == reshard.TRANSFER_COLUMNS


def test_importing_a_module_of_reshard_by_path_gives_that_module():
    import jax_amem.reshard.plan_data as by_path

    assert inspect.ismodule(by_path) and by_path.__name__ == "jax_amem.reshard.plan_data"


def test_no_module_of_reshard_is_shadowed_by_a_name_its_package_exports():
    shadowed = [info.name for info in pkgutil.iter_modules(reshard.__path__)
                if hasattr(reshard, info.name) and not inspect.ismodule(getattr(reshard, info.name))]
    assert shadowed == []
