"""The tools' error rule as the tests check it: run a tool in-process, expect one ``error:`` line and an exit status."""

from __future__ import annotations

from helpers.builders import tool
from vlbert.commands import USAGE_ERROR, run_tool

TINY_MODEL = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


def one_line_error(capsys, name: str, argv: list[str], status: int = USAGE_ERROR) -> str:
    """Run tool ``name`` with ``argv``; assert exit ``status`` and a single ``error:`` line on stderr."""
    capsys.readouterr()
    assert run_tool(tool(name), argv) == status
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    # Logging and progress bars may come before; the refusal is the last line, and the only "error:" line.
    assert lines and lines[-1].startswith("error: ") and sum(x.startswith("error: ") for x in lines) == 1, err
    return lines[-1]
