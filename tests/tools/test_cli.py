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


def test_help_lists_every_paper_figure():
    """``elmoe3d --help`` names every subcommand of ``elmoe3d paper`` (not only table3)."""
    from elmoe3d.cli.paper import FIGURES
    done = subprocess.run([sys.executable, "-m", "elmoe3d", "--help"], capture_output=True,
                          text=True, check=True)
    text = " ".join(done.stdout.split())
    start = text.index("paper the paper's evaluation")
    paper_help = text[start:text.index(" synth ", start)]
    for figure in FIGURES:
        assert f"{figure} (" in paper_help, figure
