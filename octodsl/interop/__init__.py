"""Reading and writing other systems' schedule formats."""

from .torch_csv import read_csv, write_csv

__all__ = ["read_csv", "write_csv"]
