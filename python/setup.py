"""Build hooks of the ddp_agent wheel; the metadata is in pyproject.toml.

The wheel carries compiled Go programs (ddp-agent, ddp-agent-plugins) and
libddpshim.so, none of them Python extensions: it is tagged py3-none-<platform>
(any CPython 3, this OS and architecture). From a checkout, missing binaries
are built first with `make build` (which fetches Go through scripts/deps.sh
when the machine has none).
"""

import pathlib
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 carries bdist_wheel; older ones take it from wheel
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = pathlib.Path(__file__).resolve().parent
BUNDLED = ("ddp-agent", "ddp-agent-plugins", "libddpshim.so")


class build_with_binaries(build_py):
    """Runs `make build` in the checkout when a bundled binary is missing."""

    def run(self):
        missing = [n for n in BUNDLED if not (HERE / "ddp_agent" / n).is_file()]
        if missing:
            makefile = HERE.parent / "Makefile"
            if not makefile.is_file():
                raise SystemExit(
                    f"ddp_agent: {', '.join(missing)} missing from {HERE / 'ddp_agent'} and no checkout "
                    "around it to build them in: run `make build` in a ddp-agent checkout first"
                )
            subprocess.run(["make", "-C", str(makefile.parent), "build"], check=True)
        super().run()


class platform_wheel(bdist_wheel):
    """Tags the wheel py3-none-<platform>: binaries, no Python extension."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": build_with_binaries, "bdist_wheel": platform_wheel})
