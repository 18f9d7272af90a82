"""The CLI under test for a pytest module's helper functions (issue 32 §4).

A module makes one `Cli()` (`run = Cli()`) whose helpers call `run(*args)`; an autouse
fixture of the module binds it to the `tenplex` fixture's binary (tests/conftest.py)
before each test: `run.binary = tenplex`.
"""

from __future__ import annotations

import subprocess

from daemons import run_cli


class Cli:
    """run(*args, expect_ok=...): `tenplex args` with daemons.run_cli's checks (a clear
    error where a failure is expected); `binary`, the CLI's path, for Daemon(...)."""

    def __init__(self) -> None:
        self.binary = ""

    def __call__(self, *args: str, expect_ok: bool = True) -> subprocess.CompletedProcess[str]:
        if not self.binary:
            raise RuntimeError("Cli.binary is not set: bind it to the tenplex fixture in an autouse fixture")
        p: subprocess.CompletedProcess[str] = run_cli(self.binary, *args, expect_ok=expect_ok)
        return p
