"""Builds the wheel of the tenplex package (metadata in pyproject.toml) with the CLI.

The native module tenplex._tenplex is a CMake target (python/CMakeLists.txt) that
writes python/tenplex/_tenplex.<abi>.so. When it is missing (or TENPLEX_REBUILD=1),
this builds it with CMake in build-python/ first; the wheel is then platform-specific.
The `tenplex` CLI goes into the environment's bin/ (beside its python3, which it then
uses for `tenplex import|export`): the one of the CMake build in TENPLEX_BUILD_DIR
(default build/, scripts/build.sh's), else built in build-python/ (target tenplex).
"""

import glob
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def cli_binary():
    """The CLI for the wheel's bin/ (a path relative to this folder, as data_files wants)."""
    build = os.environ.get("TENPLEX_BUILD_DIR", os.path.join(ROOT, "build"))
    cli = os.path.join(build, "bin", "tenplex")
    if os.environ.get("TENPLEX_REBUILD") == "1" or not os.access(cli, os.X_OK):
        build = os.path.join(ROOT, "build-python")
        configure(build)
        subprocess.run(["cmake", "--build", build, "--target", "tenplex"], check=True)
        cli = os.path.join(build, "bin", "tenplex")
    return os.path.relpath(cli, ROOT)


def configure(build):
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        print("tenplex: configuring CMake in", build, flush=True)
        subprocess.run(
            [
                "cmake",
                "-S",
                ROOT,
                "-B",
                build,
                "-G",
                "Ninja",
                "-DCMAKE_BUILD_TYPE=Release",
                "-DTENPLEX_BENCH=OFF",
                f"-DPython3_EXECUTABLE={sys.executable}",
                f"-DTENPLEX_PY={sys.executable}",
            ],
            check=True,
        )


def native_modules():
    return glob.glob(os.path.join(ROOT, "python", "tenplex", "_tenplex*.so"))


class BuildPy(build_py):
    def run(self):
        if not native_modules() or os.environ.get("TENPLEX_REBUILD") == "1":
            build = os.path.join(ROOT, "build-python")
            print("tenplex: building the native module with CMake in", build, flush=True)
            configure(build)
            subprocess.run(["cmake", "--build", build, "--target", "_tenplex"], check=True)
        if not native_modules():
            sys.exit("tenplex: the native module python/tenplex/_tenplex*.so was not built")
        super().run()


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel carries a native module: tag it for this platform
        return True


# build/ is CMake's: setuptools works in build-setuptools/.
# setup.py runs in its own folder under pip (the relative data_files path needs it).
os.chdir(ROOT)
setup(
    cmdclass={"build_py": BuildPy},
    distclass=BinaryDistribution,
    data_files=[("bin", [cli_binary()])],
    options={"build": {"build_base": "build-setuptools"}, "egg_info": {"egg_base": "build-setuptools"}},
)
