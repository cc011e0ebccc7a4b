"""Reading and writing other systems' schedule formats."""

from .torch_csv import export_warnings, read_csv, write_csv

__all__ = ["export_warnings", "read_csv", "write_csv"]
