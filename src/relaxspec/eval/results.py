"""The benchmark results API in one import: cells and rows (:mod:`relaxspec.eval.rows`), the
results directory (:mod:`relaxspec.eval.records`) and the tables (:mod:`relaxspec.eval.tables`)."""

from relaxspec.eval.records import (
    MANIFEST,
    RECORDS,
    ResultsStore,
    load_manifest,
    load_records,
    model_fingerprint,
)
from relaxspec.eval.rows import (
    ALL_SEEDS,
    Cell,
    Row,
    Timings,
    build_rows,
    cell_timings,
    display_labels,
    latest_records,
    references,
    sandbox_of,
    speed_between,
    speedup,
    throughput,
)
from relaxspec.eval.tables import (
    COLUMNS,
    QUALITY_NOTE,
    dataset_name,
    format_speedup,
    markdown_table,
    print_table,
    write_outputs,
)

__all__ = [
    "ALL_SEEDS",
    "COLUMNS",
    "MANIFEST",
    "QUALITY_NOTE",
    "RECORDS",
    "Cell",
    "ResultsStore",
    "Row",
    "Timings",
    "build_rows",
    "cell_timings",
    "dataset_name",
    "display_labels",
    "format_speedup",
    "latest_records",
    "load_manifest",
    "load_records",
    "markdown_table",
    "model_fingerprint",
    "print_table",
    "references",
    "sandbox_of",
    "speed_between",
    "speedup",
    "throughput",
    "write_outputs",
]
