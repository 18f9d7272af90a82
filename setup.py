"""Builds the wheel of the tenplex package (metadata in pyproject.toml).

The native module tenplex._tenplex is a CMake target (python/CMakeLists.txt) that
writes python/tenplex/_tenplex.<abi>.so. When it is missing (or TENPLEX_REBUILD=1),
this builds it with CMake in build-python/ first; the wheel is then platform-specific.
"""
import glob
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def native_modules():
    return glob.glob(os.path.join(ROOT, "python", "tenplex", "_tenplex*.so"))


class BuildPy(build_py):
    def run(self):
        if not native_modules() or os.environ.get("TENPLEX_REBUILD") == "1":
            build = os.path.join(ROOT, "build-python")
            print("tenplex: building the native module with CMake in", build, flush=True)
            subprocess.run(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                            "-DTENPLEX_BENCH=OFF", f"-DPython3_EXECUTABLE={sys.executable}"], check=True)
            subprocess.run(["cmake", "--build", build, "--target", "_tenplex"], check=True)
        if not native_modules():
            sys.exit("tenplex: the native module python/tenplex/_tenplex*.so was not built")
        super().run()


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel carries a native module: tag it for this platform
        return True


# build/ is CMake's: setuptools works in build-setuptools/.
setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution,
      options={"build": {"build_base": "build-setuptools"}, "egg_info": {"egg_base": "build-setuptools"}})
