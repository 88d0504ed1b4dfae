"""The `elmoe3d` console script's own help (each subcommand has its own tests)."""

import subprocess
import sys

import elmoe3d.cli as cli


def test_help_describes_the_tool():
    done = subprocess.run([sys.executable, "-m", "elmoe3d", "--help"], capture_output=True,
                          text=True, check=True)
    text = " ".join(done.stdout.split())
    assert " ".join(cli.DESCRIPTION.split()) in text
    assert "``" not in done.stdout and "console script" not in done.stdout
    for name, (_, help_text) in cli.COMMANDS.items():
        assert f"{name} {help_text}" in text
