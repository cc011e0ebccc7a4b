"""A two-device plan whose header takes the entries a test gives, linted: what the header-field
tests (tp, ep) share."""

from __future__ import annotations

from octodsl.lint import lint_source

BODY = """stages 2
placement loop
schedule {
  device 0 { F0:0 F0:1 BW0:0 BW0:1 }
  device 1 { F1:0 BW1:0 F1:1 BW1:1 }
}
"""


def lint(*entries: str):
    """(diagnostics, source) of the plan with `entries` as extra header lines."""
    src = (
        'plan "t" {\n  devices 2\n  microbatches 2\n'
        + "".join(f"  {e}\n" for e in entries)
        + "}\n"
        + BODY
    )
    _, diags = lint_source(src, "t.octo")
    return diags, src
