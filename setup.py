"""Which folders install, found by setuptools (pyproject.toml holds everything else).

specdec's layout keeps its stages as top-level folders (builder/, runtime/, cli/, plugins/, ...); they install as
subpackages of one import package, ``specdec``, so nothing generic like ``cli`` or ``runtime`` lands at the top of
site-packages. pyproject.toml cannot add that prefix to what ``packages.find`` finds, so this file does: every
folder with an ``__init__.py`` (tests/, benchmarks/ and examples/ have none) becomes ``specdec.<folder>``, with its
subpackages. tests/test_wheel_contents.py checks that the wheel holds every folder of Python files.
"""

from setuptools import find_packages, setup

found = find_packages(where=".", exclude=["tests", "tests.*", "build", "build.*"])
tops = sorted({name.split(".")[0] for name in found})

setup(
    packages=[f"specdec.{name}" for name in found],
    package_dir={f"specdec.{top}": top for top in tops},
)
